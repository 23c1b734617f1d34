"""The method end to end on the real runner and vllm-sim: minimal launch, repeats, ladder, verdict."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.coordinator import Coordinator
from bot.report import run_report
from bot.store import AsyncStore, Store
from kernel.analyzer import analyze_text
from kernel.analyzer.messages import first_error_message
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST, to_id
from tests.k3fixtures import KIMI_LAUNCH, bot_config, bot_core, finished_run, run_to_end, runner_data, running_runner
from vllm_sim.scenario import scenario_path

HOLDS, FAILS, MOOT = pb.CHECKLIST_STATE_HOLDS, pb.CHECKLIST_STATE_FAILS, pb.CHECKLIST_STATE_NOT_APPLICABLE


async def _run(certs: DevCerts, tmp_path: Path, scenario: str, **start: Any) -> list[pb.RunEvent]:
    runner = runner_data(certs, tmp_path / "runner", scenario=scenario)
    return await run_to_end(certs, tmp_path, runner, **start)


def _ladder(events: list[pb.RunEvent]) -> list[tuple[str, str, bool]]:
    return [
        (
            e.ladder_step.step,
            to_id(pb.LadderOutcome, e.ladder_step.outcome),
            e.ladder_step.relaunched,
        )
        for e in events
        if e.HasField("ladder_step")
    ]


def _checklist(events: list[pb.RunEvent]) -> dict[str, tuple[int, str]]:
    """The latest state of each item; each was set by a stage the checklist table names for it."""
    owners = {item.id: item.stages for item in CHECKLIST}
    latest: dict[str, tuple[int, str]] = {}
    stage = ""
    for e in events:
        if e.HasField("stage_started"):
            stage = to_id(pb.Stage, e.stage_started.stage)
        if e.HasField("checklist_item"):
            item = to_id(pb.ChecklistId, e.checklist_item.item)
            assert stage in owners[item], f"{item} set in {stage}, not by {owners[item]}"
            latest[item] = (e.checklist_item.state, e.checklist_item.evidence)
    return latest


def _stage(events: list[pb.RunEvent], stage: int) -> pb.StageFinished:
    return next(e.stage_finished for e in events if e.HasField("stage_finished") and e.stage_finished.stage == stage)


def _finished(events: list[pb.RunEvent]) -> pb.RunFinished:
    return events[-1].run_finished


async def test_prefix_caching_crash_is_found_by_its_ladder_step(certs: DevCerts, tmp_path: Path) -> None:
    events = await _run(certs, tmp_path, "prefix-cache-crash")
    assert _ladder(events) == [
        ("prefix_caching", "crash", True),  # the minimal launch had it off: turning it on is a relaunch
        ("long_input", "ok", True),  # the crash killed the server: back to the last stable configuration
        ("max_model_len", "ok", True),
        ("concurrency", "ok", False),  # request-level: the running server is reused
        ("inter_node", "not_applicable", False),
        ("tools_structured_output", "ok", True),
        ("speculative_decoding", "not_applicable", False),
        ("kernel_backends", "not_applicable", False),
        ("compilation_cuda_graphs", "not_applicable", False),
        ("kv_transfer", "not_applicable", False),
        ("lora_multimodal", "not_applicable", False),
        ("server_options", "not_applicable", False),
        ("as_written", "not_applicable", False),  # the trigger was found: its flags are in the deployment too
    ]
    tools = next(e.ladder_step for e in events if e.ladder_step.step == "tools_structured_output")
    assert list(tools.added) == ["--tool-call-parser kimi_k3", "--enable-auto-tool-choice"]
    assert tools.title == "agent tools and structured output" and tools.detail.startswith("adds --tool-call-parser")
    ladder = _stage(events, pb.STAGE_LADDER)
    assert ladder.status == pb.STAGE_STATUS_FAILED
    assert ladder.summary.startswith("prefix_caching triggers the failure")
    assert "illegal memory access" in ladder.summary
    checks = _checklist(events)
    assert checks["failure_repeated"][0] == HOLDS and "2 of 2 attempts" in checks["failure_repeated"][1]
    assert checks["prefix_caching_isolated"][0] == HOLDS
    assert (
        checks["revertible_baseline"][0] == HOLDS and "--no-enable-prefix-caching" in checks["revertible_baseline"][1]
    )
    assert checks["oom_not_secondary"] == (MOOT, "no OOM seen")
    finished = _finished(events)
    # pinned, repeated 2 of 2, a revertible baseline, the image's versions and GPU view recorded: fix in place
    assert finished.decision == pb.DECISION_FIX
    assert finished.reasons[0].startswith("all 9 checklist items that apply hold")  # no OOM: not applicable
    report = run_report("r", events)
    # minimal; prefix_caching on dummy weights and its confirmation on the real configuration; long_input (back
    # to stable), max_model_len and tools on dummy weights; the repeat of the trigger on a proxy
    assert (report["trigger_step"], report["candidates"], report["launches"]) == ("prefix_caching", [], 7)
    assert report["first_error"]["phase"] == "request" and "illegal memory access" in report["first_error"]["line"]
    assert report["checklist"]["failure_repeated"]["state"] == "holds"
    assert report["checklist"]["oom_not_secondary"] == {"state": "not_applicable", "evidence": "no OOM seen"}


async def test_max_model_len_beyond_kv_capacity_is_an_oom_at_its_step(certs: DevCerts, tmp_path: Path) -> None:
    events = await _run(certs, tmp_path, "kv-capacity")
    steps = _ladder(events)
    assert steps[0] == ("prefix_caching", "cache_hit", True)
    assert steps[2] == ("max_model_len", "oom", True)
    assert [outcome for _, outcome, _ in steps].count("oom") == 1
    signature = next(e.ladder_step.signature for e in events if e.ladder_step.step == "max_model_len")
    assert "KV cache is needed" in signature
    assert _stage(events, pb.STAGE_LADDER).summary.startswith("max_model_len triggers the failure")
    prefix = next(e.ladder_step.detail for e in events if e.ladder_step.step == "prefix_caching")
    assert "served from the prefix cache" in prefix


async def test_failure_at_minimal_launch_is_repeated_and_skips_the_ladder(certs: DevCerts, tmp_path: Path) -> None:
    events = await _run(certs, tmp_path, "demo")
    launches = _stage(events, pb.STAGE_MINIMAL_LAUNCH)
    assert launches.status == pb.STAGE_STATUS_FAILED and "(2 of 2 attempts failed the same way)" in launches.summary
    assert _stage(events, pb.STAGE_LADDER).status == pb.STAGE_STATUS_SKIPPED
    assert _stage(events, pb.STAGE_VERDICT).status == pb.STAGE_STATUS_OK  # the verdict always runs
    checks = _checklist(events)
    assert checks["failure_repeated"][0] == HOLDS
    assert checks["prefix_caching_isolated"][0] == MOOT  # off in the minimal launch, which already fails
    assert checks["revertible_baseline"][0] == FAILS
    sources = {e.log_chunk.source for e in events if e.HasField("log_chunk")}
    assert {"minimal_launch", "minimal_launch/attempt-2"} <= sources
    assert not any(e.launch_started.proxies for e in events)  # a gpu_detect failure costs seconds anyway
    assert not any(e.artifact.name == "enforce_eager_diagnostic" for e in events)  # NCCL is not a CUDA graph failure


async def test_healthy_deployment_reports_that_nothing_failed(certs: DevCerts, tmp_path: Path) -> None:
    events = await _run(certs, tmp_path, "healthy")
    assert all(outcome in ("ok", "cache_hit", "not_applicable") for _, outcome, _ in _ladder(events))
    assert _ladder(events)[-1] == ("as_written", "ok", True)  # the last rung ran, on the real configuration
    last = [e.launch_started for e in events if e.HasField("launch_started")][-1]
    assert last.source == "ladder/as_written" and not last.proxies
    assert "every step held, the deployment as written included" in _stage(events, pb.STAGE_LADDER).summary
    checks = _checklist(events)
    assert checks["first_error_saved"] == (MOOT, "nothing failed: every stage and ladder step held")
    assert _finished(events).decision == pb.DECISION_CONTINUE


async def test_a_deployment_that_turns_prefix_caching_off_gets_no_prefix_caching_probe(
    certs: DevCerts, tmp_path: Path
) -> None:
    """Nothing to add back: a cache miss on a server without prefix caching would say nothing, and cost a launch."""
    runner = runner_data(certs, tmp_path / "runner", scenario="healthy")
    events = await run_to_end(
        certs, tmp_path, runner, launch=KIMI_LAUNCH.replace("--enable-prefix-caching", "--no-enable-prefix-caching")
    )
    steps = {step: (outcome, relaunched) for step, outcome, relaunched in _ladder(events)}
    assert steps["prefix_caching"] == ("not_applicable", False)
    assert not any(e.launch_started.source.startswith("ladder/prefix_caching") for e in events)
    assert steps["as_written"] == ("ok", True)


async def test_leftover_process_makes_the_oom_secondary_and_the_launches_no_evidence(
    certs: DevCerts, tmp_path: Path
) -> None:
    events = await _run(certs, tmp_path, "leftover-process")
    holders = [e.artifact.content for e in events if e.artifact.name == "foreign_gpu_memory"]
    assert len(holders) == 2 and all("pid 4242 (python3)" in h for h in holders)  # reported before each launch
    first = next(e.first_error for e in events if e.HasField("first_error"))
    assert (first.phase, first.category, first.secondary_oom) == (pb.PHASE_GPU_DETECT, pb.ERROR_CATEGORY_OOM, True)
    checks = _checklist(events)
    assert checks["oom_not_secondary"] == (
        FAILS,
        "the OOM in gpu_detect is secondary to memory held by other processes",
    )
    assert checks["failure_repeated"][0] == pb.CHECKLIST_STATE_PENDING
    finished = _finished(events)
    assert finished.decision == pb.DECISION_CONTINUE
    assert finished.reasons[0].startswith("free the GPUs first: pid 4242 (python3)")


async def test_a_cuda_graph_capture_failure_gets_one_enforce_eager_diagnostic(certs: DevCerts, tmp_path: Path) -> None:
    events = await _run(certs, tmp_path, "cudagraph-capture")
    (diagnostic,) = [e.artifact.content for e in events if e.artifact.name == "enforce_eager_diagnostic"]
    verdict, launched = diagnostic.split(" — ")
    assert verdict == "with --enforce-eager the launch answers: CUDA graph capture is the trigger"
    assert launched.split()[-5:-4] == ["--enforce-eager"]  # the minimal command plus --enforce-eager
    launch = _stage(events, pb.STAGE_MINIMAL_LAUNCH)
    assert launch.status == pb.STAGE_STATUS_FAILED and launch.summary.endswith(verdict)
    assert "minimal_launch/enforce-eager" in {e.log_chunk.source for e in events if e.HasField("log_chunk")}
    assert _finished(events).launches == 4  # the failure, the diagnostic, the repeat, the fresh-cache control


DEPLOYMENT_LOG = (  # what `kubectl logs` of the failing deployment showed: NCCL fails while ranks start
    "(APIServer pid=1) INFO 05-12 02:46:01 [api_server.py:1] vLLM API server version 0.33.0\n"
    "(Worker_TP3 pid=9) ERROR 05-12 02:46:33 [multiproc_executor.py:862] WorkerProc failed to start.\n"
    "(Worker_TP3 pid=9) ERROR 05-12 02:46:33 [multiproc_executor.py:862] RuntimeError: NCCL error: unhandled "
    "system error (run with NCCL_DEBUG=INFO for details)\n"
)


@pytest.mark.parametrize(
    ("scenario", "compared"),
    [
        ("demo", "the deployment's failure is reproduced: gpu_detect [nccl_comm], the same first error as in its log"),
        (
            "leftover-process",
            "a different failure, a new candidate: the deployment's log fails in gpu_detect [nccl_comm] with",
        ),
    ],
)
async def test_the_deployments_own_log_is_frozen_and_compared_with_what_the_run_met(
    certs: DevCerts, tmp_path: Path, scenario: str, compared: str
) -> None:
    finding = analyze_text(DEPLOYMENT_LOG).first_error
    assert finding is not None
    events = await _run(certs, tmp_path, scenario, deployment_error=first_error_message(finding))
    scene = json.loads(next(e.artifact.content for e in events if e.artifact.name == "fingerprint"))
    assert scene["deployment_error"]["phase"] == "gpu_detect" and "NCCL error" in scene["deployment_error"]["line"]
    assert _stage(events, pb.STAGE_FREEZE).summary.endswith("the deployment failed in gpu_detect [nccl_comm]")
    assert _finished(events).reasons[-1].startswith(compared)


@pytest.mark.parametrize("bodies", ["text", "hash"])
async def test_freeze_records_the_fixed_request_or_only_its_digest(
    certs: DevCerts, tmp_path: Path, bodies: str
) -> None:
    runner = runner_data(certs, tmp_path / "runner", scenario="demo", request_bodies=bodies)
    events = await run_to_end(certs, tmp_path, runner)
    scene = json.loads(next(e.artifact.content for e in events if e.artifact.name == "fingerprint"))
    request = scene["request"]
    # the cluster's fixed request (tests/k3fixtures.py), with the model the runner fills in
    sent = json.dumps(
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "model": "moonshotai/Kimi-K3"},
        sort_keys=True,
    )
    assert (request["api"], request["repeats"]) == ("chat", 3)
    assert request["body_sha256"] == hashlib.sha256(sent.encode()).hexdigest()
    assert request["body"] == (sent if bodies == "text" else None)
    assert ('"content": "hi"' in json.dumps(scene).replace('\\"', '"')) is (bodies == "text")  # nowhere else


async def test_a_request_that_fails_while_the_server_goes_on_is_found_on_every_attempt(
    certs: DevCerts, tmp_path: Path
) -> None:
    """A 500 with the engine's traceback logged, and then nothing: no later line settles the traceback, yet
    each attempt's first error is found (not "no failure"), so the repeat counts and no proxy is abandoned."""
    scenario = tmp_path / "error.toml"
    scenario.write_text(
        '[deployment]\ncommand = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8"\n'
        '[[fault]]\nphase = "request"\neffect = "error_response"\n'
        'error = "ValueError: the chat template raised on this conversation"\n'
    )
    events = await _run(certs, tmp_path, str(scenario))
    summary = _stage(events, pb.STAGE_SINGLE_REQUEST).summary
    assert summary.startswith("the fixed request fails (the server goes on serving): failed in request")
    assert "(2 of 2 attempts failed the same way)" in summary
    assert _checklist(events)["failure_repeated"][0] == HOLDS
    assert not any(e.HasField("artifact") and e.artifact.name == "proxy_abandoned" for e in events)
    firsts = [e.first_error for e in events if e.HasField("first_error")]
    assert len(firsts) == 2 and all(f.line.endswith("the chat template raised on this conversation") for f in firsts)


async def test_a_driver_upgraded_under_a_run_makes_it_isolate(certs: DevCerts, tmp_path: Path) -> None:
    scenario = tmp_path / "host.toml"
    scenario.write_text(scenario_path("demo").read_text())
    upgraded = asyncio.Event()

    async def upgrade_after_the_first_failure(event: pb.RunEvent) -> None:
        # node automation updates the driver once freeze recorded it: whichever launch reads NVML next sees the
        # new one (the second attempt at the latest, however late a loaded machine delivers this event)
        started = event.HasField("stage_started") and event.stage_started.stage == pb.STAGE_MINIMAL_LAUNCH
        if started and not upgraded.is_set():
            scenario.write_text(
                scenario.read_text().replace('driver_version = "580.65.06"', 'driver_version = "580.82.07"')
            )
            upgraded.set()

    # slow enough for the bot to change the host between the two attempts
    runner = runner_data(certs, tmp_path / "runner", scenario=str(scenario), speed=100)
    async with running_runner(runner) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        finished = await core.follow(await core.start("cluster-a", "U1"), upgrade_after_the_first_failure)
        store.close()
    assert upgraded.is_set() and finished.decision == pb.DECISION_ISOLATE
    assert "the NVIDIA driver changed during the run (580.65.06 → 580.82.07)" in finished.reasons[0]


async def test_the_trigger_step_is_repeated_on_a_proxy_that_shows_the_same_failure(
    certs: DevCerts, tmp_path: Path
) -> None:
    events = await _run(certs, tmp_path, "prefix-cache-crash")
    sources = list(dict.fromkeys(e.log_chunk.source for e in events if e.HasField("log_chunk")))
    assert sources[:3] == ["minimal_launch", "ladder/prefix_caching/proxy", "ladder/prefix_caching/confirm"]
    assert sources[-1] == "ladder/prefix_caching/repeat-2/proxy"
    proxied = [e.launch_started for e in events if e.launch_started.proxies]
    assert all(p.source.startswith("ladder/") for p in proxied) and proxied[2].source == "ladder/max_model_len/proxy"
    assert [p.id for p in proxied[2].proxies] == ["dummy_weights"]
    # the deployment's own --load-format gives way to dummy weights; the repeat adds fewer layers and eager
    assert proxied[-1].source == "ladder/prefix_caching/repeat-2/proxy"
    assert [p.id for p in proxied[-1].proxies] == ["dummy_weights", "fewer_layers", "eager"]
    assert "--load-format dummy" in proxied[-1].line and "fastsafetensors" not in proxied[-1].line
    assert not any(e.artifact.name == "proxy_abandoned" for e in events)
    step = next(e.ladder_step for e in events if e.ladder_step.step == "prefix_caching")
    assert step.detail.endswith("(met on a proxy, confirmed on the real configuration)")
    report = run_report("r", events)
    assert report["trigger_step"] == "prefix_caching" and report["checklist"]["failure_repeated"]["state"] == "holds"
    # the report labels every launch: its source, and the proxies it ran on (null: the real configuration)
    listed = report["launch_list"]
    assert [launch["source"] for launch in listed] == sources and len(listed) == report["launches"]
    assert all((launch["proxy"] is not None) == launch["source"].endswith("/proxy") for launch in listed)
    assert listed[-1]["proxy"]["proxies"] == ["dummy_weights", "fewer_layers", "eager"]
    assert listed[-1]["proxy"]["removes"][0] == "reading the weights (random weights of the same shapes)"
    assert listed[-1]["failed"] == {"phase": "request", "category": "request_error"}
    assert listed[0] == {"source": "minimal_launch", "stage": "minimal_launch", "proxy": None, "failed": None}


async def test_a_proxy_that_does_not_reproduce_the_failure_is_abandoned_for_the_real_launch(
    certs: DevCerts, tmp_path: Path
) -> None:
    scenario = tmp_path / "host.toml"  # here the crash needs every layer: the fewer-layers proxy cannot show it
    scenario.write_text(
        scenario_path("prefix-cache-crash")
        .read_text()
        .replace("[fault.when]\n", '[fault.when]\nflags_absent = ["--hf-overrides"]\n')
    )
    events = await _run(certs, tmp_path, str(scenario))
    sources = {e.log_chunk.source for e in events if e.HasField("log_chunk")}
    assert {"ladder/prefix_caching/repeat-2/proxy", "ladder/prefix_caching/repeat-2"} <= sources
    abandoned = next(e.artifact.content for e in events if e.artifact.name == "proxy_abandoned")
    assert abandoned.startswith("the proxy launch did not fail where the real one failed in request")
    report = run_report("r", events)
    assert (
        report["launches"] == 8 and report["checklist"]["failure_repeated"]["state"] == "holds"
    )  # the abandoned proxy, one more


async def test_a_weight_load_failure_is_never_repeated_on_a_proxy(certs: DevCerts, tmp_path: Path) -> None:
    scenario = tmp_path / "host.toml"
    scenario.write_text(
        scenario_path("demo")
        .read_text()
        .replace(
            'phase = "gpu_detect"\nerror = "nccl_dmabuf_unsupported"',
            'phase = "weight_load"\nerror = "safetensors._safetensors_rust.SafetensorError: Error while '
            'deserializing header: incomplete metadata, file not fully covered"',
        )
        .replace("--load-format fastsafetensors ", "")
    )
    events = await _run(certs, tmp_path, str(scenario))
    error = next(e.first_error for e in events if e.HasField("first_error"))
    assert to_id(pb.Phase, error.phase) == "weight_load"
    assert not any(e.launch_started.proxies for e in events)
    sources = {e.log_chunk.source for e in events if e.HasField("log_chunk")}
    assert "minimal_launch/attempt-2" in sources


async def test_show_json_carries_the_run_report_of_any_run(
    certs: DevCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runner = runner_data(certs, tmp_path / "runner", scenario="demo")
    async with bot_core(certs, tmp_path, runner) as core:
        started = await finished_run(core)
        events = await core.store.call(Store.events, started.run_id)
    (tmp_path / "k3.toml").write_text(
        f'store = "{tmp_path / "k3.db"}"\n[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "i"\nlaunch = "vllm serve m"\n'
    )
    capsys.readouterr()
    assert main(["--config", str(tmp_path / "k3.toml"), "show", started.run_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["report"] == run_report(started.run_id, events)
    assert shown["report"]["first_error"]["category"] == "nccl_comm" and shown["report"]["launches"] == 2
