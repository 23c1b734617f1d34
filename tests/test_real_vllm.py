"""The whole method against real vLLM (the CPU build), through the real runner's process backend and the bot core.

Launches take ~30 s with --enforce-eager (a flag of the minimal launch: vLLM CPU skips its compiled warm-up), ~50 s
without; the healthy case with prefix caching runs the deployment exactly as the issue that found it did.
Each case is a real failure made deterministic on this machine (a model or flags that fail the same way every
time) or a healthy deployment; the assertions are the decisive findings an engineer would act on. The messages
are vLLM's own: nothing here was copied into a catalogue.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kernel.vllm_cli import flag_table
from protos import runner_pb2 as pb
from tests.real_vllm_method import Run, assert_repeated_failure, first_errors, ladder, sources, stage
from tests.vllm_cpu import ENV, vllm_python

pytestmark = pytest.mark.timeout(900)


async def test_a_request_that_kills_the_engine_is_relaunched_and_repeated(
    real_run: Run, vllm_models: dict[str, Path]
) -> None:
    events, report = await real_run(vllm_models["llama-head16"], "--enforce-eager")
    assert_repeated_failure(report, events, "request", "request_error")
    assert "Unsupported CPU attention configuration: head_dim=16" in report["first_error"]["line"]
    assert stage(events, pb.STAGE_SINGLE_REQUEST).status == pb.STAGE_STATUS_FAILED
    assert stage(events, pb.STAGE_LADDER).status == pb.STAGE_STATUS_SKIPPED
    assert report["launches"] == 2
    # the repeat ran on a proxy (dummy weights, one layer: real vLLM CPU takes both) and showed the same crash
    assert sources(events) == ["minimal_launch", "single_request/attempt-2/proxy"]
    proxy = next(e.launch_started for e in events if e.launch_started.proxies)
    assert "--load-format dummy" in proxy.line and '{"num_hidden_layers": 1}' in proxy.line


async def test_a_config_error_at_its_ladder_step_is_the_trigger(real_run: Run, vllm_models: dict[str, Path]) -> None:
    events, report = await real_run(vllm_models["llama-4k"], "--enforce-eager", "--max-model-len", "100000")
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
    real_run: Run, vllm_models: dict[str, Path]
) -> None:
    """Disaggregated prefill through NIXL, on a host without NIXL: vLLM CPU's worker fails to start. The minimal
    launch strips --kv-transfer-config and answers; the ladder's KV-transfer step puts it back and meets it."""
    transfer = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'
    events, report = await real_run(
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


async def test_unreadable_weights_fail_in_weight_load(real_run: Run, vllm_models: dict[str, Path]) -> None:
    events, report = await real_run(vllm_models["broken-weights"], "--enforce-eager")
    assert_repeated_failure(report, events, "weight_load", "weight_load")
    assert "SafetensorError" in report["first_error"]["line"]
    assert report["launches"] == 2


async def test_an_unknown_architecture_is_a_model_config_error(real_run: Run, vllm_models: dict[str, Path]) -> None:
    events, report = await real_run(vllm_models["unknown-arch"], "--enforce-eager")
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
