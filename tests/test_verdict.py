"""The verdict's decision from the evidence a run gathered (isolate / continue / fix), and who writes that
evidence: each part of a run's state has its owners (runner/stages/context.py)."""

from __future__ import annotations

import ast
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


def test_an_attempt_that_did_not_fail_is_neither_a_failure_nor_an_inconclusive_outcome() -> None:
    assert NOT_FAILED.held and not NOT_FAILED.failed
    on_proxy = Attempt.did_not_fail(("load_format_dummy",))
    assert on_proxy.held and on_proxy.proxy == ("load_format_dummy",)
    refused = Attempt.inconclusive(
        "HTTP 400", "probe_error"
    )  # nothing tested: no failure, and not a clean answer either
    assert not refused.failed and not refused.held
    assert Attempt("engine_init", "oom", "s").failed and not Attempt("engine_init", "oom", "s").held


RUNNER = Path(__file__).resolve().parents[1] / "runner"
PARTS = ("evidence", "session", "plan", "verdict")
CHANGES = ("append", "extend", "insert", "pop", "clear", "update", "remove", "setdefault")  # in-place writes
# Who writes each field of the run's parts, as the parts' docstrings say: the engine session only the launcher, the
# verdict only its stage, the proxy plan only proxies.py; evidence is appended by the stage that finds it.
WRITERS = {
    "evidence.checklist": {"stages/context.py"},
    "evidence.fingerprint": {"stages/freeze.py"},
    "evidence.drivers": {"stages/freeze.py", "stages/launcher.py"},
    "evidence.images": {"stages/freeze.py", "stages/launcher.py"},
    "evidence.holders": {"stages/launcher.py"},
    "evidence.holder_notes": {"stages/launcher.py"},
    "evidence.attempts": {"stages/minimal_launch.py", "stages/single_request.py", "stages/ladder.py"},
    "evidence.steps": {"stages/ladder.py"},
    "evidence.diagnosis": {"stages/minimal_launch.py"},
    "evidence.stale_caches": {"stages/cache_control.py"},
    "session.launches": {"stages/launcher.py"},
    "session.running_proxies": {"stages/launcher.py"},
    "session.engine": {"stages/launcher.py"},
    "session.base_url": {"stages/launcher.py"},
    "session.follower": {"stages/launcher.py"},
    "session.running": {"stages/launcher.py"},
    "plan.stable": {"stages/single_request.py", "stages/ladder.py"},
    "plan.proxy_for": {"stages/proxies.py"},
    "plan.ladder_proxies": {"stages/proxies.py"},
    "verdict.decision": {"stages/verdict.py"},
    "verdict.reasons": {"stages/verdict.py"},
    "verdict.headline": {"stages/verdict.py"},
}


def _written(target: ast.expr) -> str:
    """`part.field` when `target` is a field of a part (`ctx.plan.stable`, `session.launches`, `x.holders[k]`)."""
    while isinstance(target, ast.Subscript):
        target = target.value
    if not isinstance(target, ast.Attribute):
        return ""
    owner = target.value
    part = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
    return f"{part}.{target.attr}" if part in PARTS else ""


def test_each_part_of_a_runs_state_is_written_by_its_owners() -> None:
    writers: dict[str, set[str]] = {}
    for path in sorted(RUNNER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [
                    t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
                ]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in CHANGES:
                targets = [node.func.value]
            for target in targets:
                if field := _written(target):
                    writers.setdefault(field, set()).add(str(path.relative_to(RUNNER)))
    assert writers == WRITERS
