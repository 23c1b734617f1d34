"""The verdict's decision from the evidence a run gathered (isolate / continue / fix)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernel.vllm_cli import parse_launch_command
from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, from_id
from runner.config import parse_runner_config
from runner.stages.context import NOT_FAILED, Attempt, RunContext
from runner.stages.verdict import decide, run


def _context(tmp_path: Path, **evidence: Any) -> RunContext:
    config = parse_runner_config({"name": "r", "cluster": "c", "allowed_images": ["*"]}, base=tmp_path, origin="test")

    async def emit(**_: object) -> pb.RunEvent:
        return pb.RunEvent()

    ctx = RunContext(
        "run",
        pb.StartRunRequest(),
        parse_launch_command(["vllm", "serve", "m"]),
        config,
        None,  # type: ignore[arg-type]  # the verdict reads no engine
        emit,
    )
    for name, value in evidence.items():
        setattr(ctx.evidence, name, value)
    return ctx


def test_failures_at_different_phases_mean_isolate(tmp_path: Path) -> None:
    ctx = _context(
        tmp_path, attempts=[Attempt("gpu_detect", "nccl_comm", "a"), Attempt("weight_load", "weight_load", "b")]
    )
    decision, reasons = decide(ctx)
    assert decision == pb.DECISION_ISOLATE
    assert reasons == ["the same command fails at different phases from attempt to attempt: gpu_detect, weight_load"]


def test_an_unknown_phase_is_no_different_phase(tmp_path: Path) -> None:
    # A failure nothing placed (phase "unknown") beside a placed one: the phase did not move, nothing is decided.
    ctx = _context(tmp_path, attempts=[Attempt("unknown", "nccl_comm", "a"), Attempt("gpu_detect", "nccl_comm", "b")])
    assert not any("different phases" in reason for reason in decide(ctx)[1])


def test_gpu_memory_holders_that_come_and_go_mean_isolate(tmp_path: Path) -> None:
    ctx = _context(
        tmp_path,
        holders=[frozenset(), frozenset({4242})],
        holder_notes={4242: "pid 4242 (python3) 100 MiB on 1 GPU(s)"},
    )
    decision, reasons = decide(ctx)
    assert decision == pb.DECISION_ISOLATE
    assert "GPU state changed under us" in reasons[0] and "launch 2: pid 4242" in reasons[0]


def test_a_driver_that_changes_during_the_run_means_isolate(tmp_path: Path) -> None:
    ctx = _context(tmp_path, drivers=["580.65.06", "580.65.06", "580.82.07"])
    assert decide(ctx) == (
        pb.DECISION_ISOLATE,
        ["the NVIDIA driver changed during the run (580.65.06 → 580.82.07): it cannot be pinned here"],
    )
    assert decide(_context(tmp_path, drivers=["580.65.06", "580.65.06"]))[0] == pb.DECISION_CONTINUE


def test_an_image_that_moves_during_the_run_means_isolate(tmp_path: Path) -> None:
    ctx = _context(tmp_path, images=["sha256:" + "a" * 64, "sha256:" + "a" * 64, "sha256:" + "b" * 64])
    ctx.request.image = "vllm/vllm-openai:kimi-k3"
    decision, reasons = decide(ctx)
    assert decision == pb.DECISION_ISOLATE
    assert reasons == [
        f"image vllm/vllm-openai:kimi-k3 moved during the run ({'a' * 12} → {'b' * 12}): what failed cannot be "
        "rolled back to"
    ]


def test_an_image_without_a_registry_digest_means_isolate(tmp_path: Path) -> None:
    ctx = _context(
        tmp_path, fingerprint={"image": {"ref": "vllm/vllm-openai:kimi-k3", "id": "sha256:1", "repo_digests": []}}
    )
    assert decide(ctx)[0] == pb.DECISION_ISOLATE


def test_all_ten_items_holding_means_fix(tmp_path: Path) -> None:
    holds = {from_id(pb.ChecklistId, item): (pb.CHECKLIST_STATE_HOLDS, "x") for item in CHECKLIST_IDS}
    assert decide(_context(tmp_path, checklist=holds))[0] == pb.DECISION_FIX
    del holds[pb.CHECKLIST_ID_FAILURE_REPEATED]
    decision, reasons = decide(_context(tmp_path, checklist=holds))
    assert (decision, reasons) == (pb.DECISION_CONTINUE, ["no evidence yet for: failure_repeated"])


async def test_a_flaky_failure_is_not_repeated(tmp_path: Path) -> None:
    ctx = _context(tmp_path, attempts=[Attempt("request", "other", "s"), NOT_FAILED])
    await run(ctx)
    state, evidence = ctx.evidence.checklist[pb.CHECKLIST_ID_FAILURE_REPEATED]
    assert state == pb.CHECKLIST_STATE_FAILS
    assert evidence == "1 of 2 attempts failed the same way (#1: request; #2: no failure)"
    assert ctx.verdict.decision == pb.DECISION_CONTINUE  # one failed attempt and one clean one: not two phases
