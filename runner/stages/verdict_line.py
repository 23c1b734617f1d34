"""The verdict as one plain line an engineer acts on: the cause, its evidence, and the next action (DESIGN §1,
verdict). It is what the card, the thread, the terminal and the report show first; the reasons follow it."""

from __future__ import annotations

from functools import cache

from kernel.analyzer import default_rules
from kernel.analyzer.lines import LineParser
from protos import runner_pb2 as pb
from runner.stages.context import Attempt, RunContext, StepOutcome

SHORT_CHARS = 160


def headline(ctx: RunContext) -> str:
    """`cause (evidence). Next: action; action`."""
    cause, evidence, actions = _finding(ctx)
    actions = [*actions, *_to_fix(ctx)]
    said = f"{cause} ({evidence})" if evidence else cause
    return f"{said}. Next: {'; '.join(actions)}" if actions else said


def _finding(ctx: RunContext) -> tuple[str, str, list[str]]:
    run, caches = ctx.run_id, ctx.evidence.stale_caches
    if ctx.verdict.decision == pb.DECISION_ISOLATE:
        clear = [f"clear {', '.join(caches)} (fresh caches started)"] if caches else []
        return (
            f"the environment is unstable: {ctx.verdict.reasons[0]}",
            "",
            [*clear, f"rerun the frozen case on an isolated node (/k3repro rerun {run} isolated)"],
        )
    if stale := _stale_cache(ctx):
        return stale
    if ctx.stopped_at and ctx.stopped_at[0] == "baseline":
        return f"the baseline blocks this scene: {ctx.stopped_at[1]}", "nothing was launched", ["fix the scene first"]
    trigger = next((s for s in ctx.evidence.steps if s.failure is not None), None)
    if trigger is not None and trigger.failure is not None:
        return _trigger(ctx, trigger, trigger.failure)
    failed = next((a for a in ctx.evidence.attempts if a.failed), None)
    if failed is not None:
        return _early(ctx, failed)
    if ctx.evidence.steps:
        return (
            "the failure did not reproduce: every ladder step held, the deployment as written included",
            f"{ctx.session.launches} launches",
            [
                "start again with the failing deployment's own log (k3repro start CLUSTER --log FILE) so the run compares its failure",
                f"compare this host with the failing one (k3repro diff {run} OTHER-RUN)",
            ],
        )
    if ctx.stopped_at:
        return f"the run stopped in {ctx.stopped_at[0]}: {ctx.stopped_at[1]}", "", []
    return ctx.verdict.reasons[0] if ctx.verdict.reasons else "no evidence", "", []


def _stale_cache(ctx: RunContext) -> tuple[str, str, list[str]] | None:
    """The fresh-cache control's finding when it answered (stages/cache_control.py): the cache is the cause."""
    state, evidence = _control(ctx)
    if state != pb.CHECKLIST_STATE_FAILS:
        return None
    failed = next((a for a in ctx.evidence.attempts if a.failed), None)
    seen = f"{_repeats(ctx)} failed, first in {failed.phase} [{failed.category}]: {short(failed)}" if failed else ""
    where = ", ".join(ctx.evidence.stale_caches) or "the engine's caches"
    return (
        evidence,
        seen,
        [f"clear {where} (or move it aside) and start again", "find what wrote it: a version change, a shared cache"],
    )


def _control(ctx: RunContext) -> tuple[pb.ChecklistState, str]:
    """The fresh-cache control's checklist item (caches_not_stale): its state and evidence."""
    return ctx.evidence.checklist.get(pb.CHECKLIST_ID_CACHES_NOT_STALE, (pb.CHECKLIST_STATE_PENDING, ""))


def _trigger(ctx: RunContext, step: StepOutcome, failure: Attempt) -> tuple[str, str, list[str]]:
    flags = " ".join(step.added)
    what = flags if flags else f"the {step.step} step"
    cause = f"{what} makes the engine fail in {failure.phase} [{failure.category}]: {short(failure)}{_waits(failure)}"
    confirmed = ", confirmed on the real configuration" if "confirmed on the real configuration" in step.detail else ""
    actions = [f"serve without {what}" if flags else f"serve without what the {step.step} step adds"]
    if len(step.added) > 1:
        actions.append(f"/k3repro minimize {ctx.run_id} to find which of its {len(step.added)} flags it is")
    elif flags:
        actions.append(f"/k3repro minimize {ctx.run_id} to confirm the flag alone")
    return cause, f"{_repeats(ctx)}{confirmed}", actions


def _early(ctx: RunContext, failed: Attempt) -> tuple[str, str, list[str]]:
    where = "the minimal launch" if ctx.plan.stable is None else "the fixed request"
    cause = f"{where} fails in {failed.phase} [{failed.category}]: {short(failed)}{_waits(failed)}"
    actions: list[str] = []
    if ctx.evidence.diagnosis:
        cause += f"; {ctx.evidence.diagnosis}"
        if "answers" in ctx.evidence.diagnosis:
            actions.append("serve with --enforce-eager, or give CUDA graphs more memory (--gpu-memory-utilization)")
    if failed.secondary_oom or any(ctx.evidence.holders):
        holders = sorted(frozenset().union(*ctx.evidence.holders))
        named = ", ".join(ctx.evidence.holder_notes[p] for p in holders[:3])
        cause += "; the OOM is secondary" if failed.secondary_oom else ""
        actions.append(f"free the GPUs first ({named})" if named else "find what else holds GPU memory")
    if _control(ctx)[0] == pb.CHECKLIST_STATE_HOLDS:
        cause += "; it fails the same with fresh caches: not the caches"
    if not actions:
        actions.append(f"rerun on an isolated node (/k3repro rerun {ctx.run_id} isolated) to tell software from host")
    return cause, _repeats(ctx), actions


def _waits(failure: Attempt) -> str:
    """Where a hang waited, from the engine's stacks: what an engineer would attach py-spy to find out."""
    return f"; where it waits: {failure.waits}" if failure.waits else ""


def _repeats(ctx: RunContext) -> str:
    attempts = [a for a in ctx.evidence.attempts if not a.foreign]
    if not attempts:
        return "attempted once"
    same = sum(1 for a in attempts if a.same_as(attempts[0]))
    return f"{same} of {len(attempts)} attempts"


def _to_fix(ctx: RunContext) -> list[str]:
    """What `fix` still needs, once a failure was found: the items without evidence, by name."""
    found = ctx.evidence
    if ctx.verdict.decision != pb.DECISION_CONTINUE or not (found.attempts or any(s.failure for s in found.steps)):
        return []
    missing = ctx.unsettled()
    return [f"to reach fix, settle {', '.join(missing)}"] if missing else []


@cache
def _parser() -> LineParser:
    return LineParser(default_rules().line)


def short(failure: Attempt) -> str:
    """The first error's message without the process prefix and log header, cut to a readable length."""
    text = _parser().parse(failure.line).msg.strip() if failure.line else failure.signature.split(":", 2)[-1]
    return text if len(text) <= SHORT_CHARS else text[: SHORT_CHARS - 1] + "…"
