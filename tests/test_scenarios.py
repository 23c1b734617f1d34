"""Every shipped vllm-sim scenario, run through the whole method the way `k3repro demo --scenario` runs it
(the scenario's [deployment] as the cluster's): the decision, the ladder step that triggers the failure and
the first error each one must produce."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.commands.common import CommandError
from demo.run import demo
from tests.k3fixtures import SIM_SPEED
from vllm_sim.scenario import builtin_scenarios, scenario_path

# A start-up hang runs slower than the other tests' SIM_SPEED: it must be found as a stall, and the sim's own
# Python start-up (~0.2 s of the wall, before its first line) counts as engine time: at 2000 it stays far from
# the ready_timeout_s - stall_timeout_s that would turn the hang into "not ready".
STARTUP_HANG_SPEED = 2000
STARTUP_HANGS = {"nccl-init-hang", "autotune-hang", "collective-hang"}


@dataclass(frozen=True)
class Expected:
    decision: str
    trigger_step: str | None
    first_error: tuple[str, str, str] | None  # phase, category, a piece of the first error's line
    secondary_oom: bool = False
    launches: int | None = None


# A trigger pinned to its ladder step and repeated 2 of 2 on a stable host whose image's versions and GPU view were
# recorded settles every checklist item that applies: `fix`. A failure of the minimal launch leaves no revertible
# baseline, a healthy run nothing repeated: `continue`.
EXPECTED = {
    # failures that need a flag the minimal launch strips: found where the ladder climbs back to the deployment
    "attention-backend": Expected(
        "fix", "kernel_backends", ("engine_init", "driver_cuda_init", "no kernel image is available")
    ),
    "spec-decode-crash": Expected(
        "fix", "speculative_decoding", ("request", "request_error", "an illegal memory access")
    ),
    "full-cudagraph-mla": Expected(  # only the two flags together: kernel_backends holds alone
        "fix", "compilation_cuda_graphs", ("engine_init", "cudagraph", "not permitted when stream is capturing")
    ),
    "autotune-hang": Expected("fix", "kernel_backends", ("engine_init", "other", "hang: no progress")),
    "tuned-healthy": Expected("continue", None, None),
    "concurrency-oom": Expected("fix", "concurrency", ("request", "oom", "torch.OutOfMemoryError: CUDA out of")),
    "collective-hang": Expected("continue", None, ("engine_init", "other", "hang: no progress in engine_init")),
    # the failure, the --enforce-eager diagnostic, the repeat, the fresh-cache control (it fails the same)
    "cudagraph-capture": Expected("continue", None, ("engine_init", "oom", "CUDA out of memory"), launches=4),
    # two failures (one repeat's proxy showed another error, so the real one was made) and the control: a proxy
    # with fresh caches answers, so the real configuration is launched with fresh caches too, and answers
    "stale-jit-cache": Expected("continue", None, ("engine_init", "compile", "an illegal memory access"), launches=5),
    "demo": Expected("continue", None, ("gpu_detect", "nccl_comm", "NCCL error: unhandled system error")),
    "flaky-phases": Expected("isolate", None, ("weight_load", "driver_cuda_init", "uncorrectable ECC error")),
    "healthy": Expected("continue", None, None),
    "kv-capacity": Expected("fix", "max_model_len", ("engine_init", "kv_cache_capacity", "KV cache is needed")),
    "leftover-process": Expected("continue", None, ("gpu_detect", "oom", "Free memory on device"), secondary_oom=True),
    "nccl-init-hang": Expected("continue", None, ("gpu_detect", "nccl_comm", "hang: no progress in gpu_detect")),
    "old-driver": Expected("continue", None, None, launches=0),  # the baseline stops it before any launch
    "prefix-cache-crash": Expected(
        "fix", "prefix_caching", ("request", "request_error", "an illegal memory access was encountered")
    ),
}


_RUNS: dict[str, tuple[dict[str, Any], str]] = {}  # one run per shipped scenario, shared by the tests below


@pytest.fixture(autouse=True)
def _host_flashinfer_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """stale-jit-cache's host cache (where its older image's kernels are) in a folder of the session, not this
    machine's home: one folder for every run of the module, as one host's cache would be."""
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path_factory.getbasetemp() / "host-flashinfer"))


async def _report(tmp_path: Path, scenario: Path, speed: float = SIM_SPEED) -> tuple[dict[str, Any], str]:
    out = io.StringIO()
    report = await demo(tmp_path, scenario, speed, logs=False, out=out)
    return report, out.getvalue()


async def _report_of(tmp_path: Path, text: str) -> tuple[dict[str, Any], str]:
    """The demo on a scenario file of this text."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(text)
    return await _report(tmp_path / "run", scenario)


async def _shipped(name: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    if name not in _RUNS:
        speed = STARTUP_HANG_SPEED if name in STARTUP_HANGS else SIM_SPEED
        _RUNS[name] = await _report(tmp_path, scenario_path(name), speed)
    return _RUNS[name]


def test_every_shipped_scenario_has_expectations() -> None:
    assert sorted(EXPECTED) == builtin_scenarios()


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_shipped_scenario_reaches_its_verdict(tmp_path: Path, name: str) -> None:
    expected = EXPECTED[name]
    report, printed = await _shipped(name, tmp_path)
    assert (report["decision"], report["trigger_step"]) == (expected.decision, expected.trigger_step), printed[-3000:]
    first = report["first_error"]
    if expected.first_error is None:
        assert first is None
    else:
        phase, category, piece = expected.first_error
        assert (first["phase"], first["category"]) == (phase, category), first
        assert piece in first["line"] and first["signature"].startswith(f"{phase}:{category}:")
        assert first["secondary_oom"] is expected.secondary_oom
    if expected.launches is not None:
        assert report["launches"] == expected.launches
    assert report["candidates"] == []


@pytest.mark.parametrize(
    ("name", "cause", "action"),
    [
        ("prefix-cache-crash", "--enable-prefix-caching makes the engine fail in request", "serve without"),
        ("cudagraph-capture", "CUDA graph capture is the trigger", "serve with --enforce-eager"),
        ("leftover-process", "the OOM is secondary", "free the GPUs first (pid 4242"),
        ("old-driver", "the baseline blocks this scene", "fix the scene first"),
        ("flaky-phases", "the environment is unstable", "rerun the frozen case on an isolated node"),
        (
            "stale-jit-cache",
            "a fresh flashinfer cache starts",
            "/host-flashinfer/.cache/flashinfer (or move it aside) and start again",
        ),
        ("healthy", "did not reproduce: every ladder step held, the deployment as written included", "--log"),
        (
            "demo",
            "the minimal launch fails in gpu_detect [nccl_comm]",
            "to reach fix, settle single_request_fixed, revertible_baseline",
        ),
    ],
)
async def test_the_verdict_is_one_line_with_its_cause_evidence_and_next_action(
    tmp_path: Path, name: str, cause: str, action: str
) -> None:
    report, printed = await _shipped(name, tmp_path)
    line = report["verdict_line"]
    said, _, next_actions = line.partition(". Next: ")
    assert cause in said and action in next_actions, line
    assert "`" not in line and "<" not in line  # plain text: each front-end formats it
    verdict = next(text for text in printed.split("\n") if "Verdict:" in text)
    following = printed.split(verdict, 1)[1].split("\n")[1]
    assert following.strip() == line  # first under the verdict's title


async def test_the_demo_launches_the_scenarios_deployment(tmp_path: Path) -> None:
    report, printed = await _shipped("concurrency-oom", tmp_path)
    # only concurrency-oom's deployment has concurrency flags: the step relaunches to restore them
    assert {"step": "concurrency", "outcome": "oom", "relaunched": True} in report["ladder"]
    assert "image vllm/vllm-openai:kimi-k3" in printed


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("attention-backend", ["--attention-backend FLASHMLA"]),
        ("spec-decode-crash", ["--speculative-config"]),
        ("full-cudagraph-mla", ["--compilation-config"]),  # on top of the kernel step's backend, which held
        ("autotune-hang", ["--enable-flashinfer-autotune"]),
    ],
)
async def test_a_failure_only_a_stripped_flag_causes_is_found_on_the_way_back_and_repeated(
    tmp_path: Path, name: str, flags: list[str]
) -> None:
    report, printed = await _shipped(name, tmp_path)
    trigger = next(step for step in report["ladder"] if step["step"] == report["trigger_step"])
    assert trigger["relaunched"] and trigger["outcome"] != "ok"
    line = next(line for line in printed.split("\n") if f"ladder · {report['trigger_step']}:" in line)
    assert all(flag in line for flag in flags), line  # the step names every flag it adds
    assert report["checklist"]["failure_repeated"]["state"] == "holds"  # confirmed like any other trigger: 2 of 2
    assert "did not reproduce" not in printed
    # the rungs after the trigger still ran; the deployment as written was not needed once the failure was met
    assert report["ladder"][-1] == {"step": "as_written", "outcome": "not_applicable", "relaunched": False}


async def test_a_healthy_tuned_deployment_ends_on_its_own_command_launched_and_held(tmp_path: Path) -> None:
    report, printed = await _shipped("tuned-healthy", tmp_path)
    ran = [step["step"] for step in report["ladder"] if step["outcome"] != "not_applicable"]
    groups = ["speculative_decoding", "kernel_backends", "compilation_cuda_graphs", "kv_transfer", "lora_multimodal"]
    assert ran[-7:] == [*groups, "server_options", "as_written"]
    assert report["ladder"][-1] == {"step": "as_written", "outcome": "ok", "relaunched": True}
    assert "every step held, the deployment as written included" in printed


async def test_flaky_phases_is_isolated_for_its_moving_failure(tmp_path: Path) -> None:
    report, printed = await _shipped("flaky-phases", tmp_path)
    assert "the same command fails at different phases from attempt to attempt: weight_load, engine_init" in printed
    assert report["checklist"]["failure_repeated"]["state"] == "fails"


async def test_a_hang_is_cut_short_and_reported_as_the_finding(tmp_path: Path) -> None:
    report, printed = await _shipped("nccl-init-hang", tmp_path)
    assert (
        report["launches"] == 2 and report["checklist"]["failure_repeated"]["state"] == "holds"
    )  # the hang, and its repeat
    assert "NCCL_DEBUG=INFO" in printed  # the hang's hint
    assert report["checklist"]["first_error_saved"]["state"] == "holds"


async def test_any_scenario_file_runs_from_its_deployment(tmp_path: Path) -> None:
    report, printed = await _report_of(
        tmp_path,
        "[deployment]\n"
        'command = "vllm serve moonshotai/Kimi-K3 -tp 8 --trust-remote-code --max-model-len 262144 '
        '--enable-auto-tool-choice --tool-call-parser kimi_k2"\n'
        'image = "registry.example.com/vllm:k3-tools"\n'
        'request = { max_tokens = 16, messages = [{ role = "user", content = "Say hello." }] }\n'
        '[[fault]]\neffect = "error_response"\nerror = "ValueError: kimi_k2 tool parser: unexpected token"\n'
        'when = { flags_present = ["--enable-auto-tool-choice"], tools = true }\n',
    )
    assert report["trigger_step"] == "tools_structured_output"
    assert report["first_error"]["line"].endswith("ValueError: kimi_k2 tool parser: unexpected token")
    assert "image registry.example.com/vllm:k3-tools" in printed and "(max_tokens 16)" in printed


async def test_each_request_records_gpu_memory_and_the_warnings_logged_meanwhile(tmp_path: Path) -> None:
    _, printed = await _report_of(
        tmp_path,
        '[deployment]\ncommand = "vllm serve org/model -tp 2 --gpu-memory-utilization 0.5"\n'
        'request = { max_tokens = 8, guided_json = { type = "object" }, messages = [{ role = "user", content = "hi" }] }\n'
        "[host]\ngpu_count = 4\ngpu_memory_mib = 81920\n",
    )
    requests = [line for line in printed.split("\n") if "request #" in line]
    # what the engine reserves up front on two of the four GPUs: vLLM's default 0.92 in the minimal launch, the
    # deployment's 0.5 once the max_model_len step has restored --gpu-memory-utilization
    assert all("GPU memory 150,732 → 150,732 MiB" in line for line in requests[:3]), requests
    assert "GPU memory 81,920 → 81,920 MiB" in requests[-1], requests
    assert "· 1 warning(s)" in requests[0] and "warning(s)" not in requests[1]  # vLLM warns once per server
    warnings = [line for line in printed.split("\n") if line.strip().startswith("warning: ")]
    assert warnings and all(
        " WARNING " in w and "removed guided-decoding field(s) ['guided_json']" in w for w in warnings
    )


async def test_a_request_the_engine_never_answers_is_a_hang_found_at_its_ladder_step(tmp_path: Path) -> None:
    report, _ = await _report_of(
        tmp_path,
        '[deployment]\ncommand = "vllm serve org/model --max-model-len 8192 --enable-prefix-caching"\n'
        '[[fault]]\neffect = "hang"\nerror = "rank0: NCCL watchdog: collective operation timeout is approaching"\n'
        'when = { flags_present = ["--enable-prefix-caching"], repeated_prefix = true, prompt_tokens_min = 500 }\n',
    )
    assert report["trigger_step"] == "prefix_caching"
    assert report["ladder"][0] == {"step": "prefix_caching", "outcome": "comm_error", "relaunched": True}
    first = report["first_error"]
    assert (first["phase"], first["category"]) == ("request", "nccl_comm")
    assert first["line"].startswith("hang: no progress in request for 120 s; last line: (EngineCore pid=")
    assert first["line"].endswith("NCCL watchdog: collective operation timeout is approaching")
    assert report["checklist"]["failure_repeated"]["state"] == "holds"  # the trigger step hung again


async def test_a_broken_scenario_file_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    with pytest.raises(
        CommandError, match=r"scenario.toml: \[deployment\]: 'command': unrecognized arguments: --turbo"
    ):
        await _report_of(tmp_path, '[deployment]\ncommand = "vllm serve m --turbo"\n')
    assert not (tmp_path / "run" / "runner-state").exists()
