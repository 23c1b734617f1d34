"""Healthy deployments on real vLLM (the CPU build): every ladder step holds, the deployment as written included,
and the prefix cache is read from the real server's /metrics deltas. The case with prefix caching runs compiled (no
--enforce-eager), as the issue that found it did."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real_vllm_method import Run, first_errors, ladder

pytestmark = pytest.mark.timeout(900)


async def test_healthy_deployment_with_prefix_caching_ends_without_a_failure(
    real_run: Run, vllm_models: dict[str, Path]
) -> None:
    events, report = await real_run(
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


async def test_healthy_deployment_with_a_short_context(real_run: Run, vllm_models: dict[str, Path]) -> None:
    events, report = await real_run(vllm_models["llama-4k"], "--enforce-eager", "--max-model-len", "512")
    assert first_errors(events) == []
    steps = ladder(report)
    assert steps["prefix_caching"] == "cache_hit"  # vLLM's default: on
    assert steps["long_input"] == "ok"
    answered = [e.request_result for e in events if e.HasField("request_result")]
    assert all(r.http_status == 200 for r in answered)
    assert max(r.prompt_tokens for r in answered) <= 512 - 16
    assert report["launches"] == 4  # minimal, max_model_len on dummy weights, the deployment as written
