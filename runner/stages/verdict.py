"""verdict: the checklist items filled from the run's evidence, and the decision fix / isolate / continue."""

from __future__ import annotations

from typing import Any

from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, UNKNOWN_PHASE, from_id, to_id
from runner.stages.context import RunContext, StageResult
from runner.stages.launcher import shell_line
from runner.stages.verdict_line import headline

HOLDS, FAILS, PENDING = pb.CHECKLIST_STATE_HOLDS, pb.CHECKLIST_STATE_FAILS, pb.CHECKLIST_STATE_PENDING
MOOT = pb.CHECKLIST_STATE_NOT_APPLICABLE  # the item's step had nothing to settle: it neither holds nor blocks fix
ISOLATED_BY_MINIMAL = (
    "the minimal launch runs with prefix caching off and already fails: prefix caching is not involved"
)


async def run(ctx: RunContext) -> StageResult:
    await _first_error(ctx)
    await _prefix_caching(ctx)
    await _oom(ctx)
    await _revertible(ctx)
    await _repeated(ctx)
    await _caches(ctx)
    ctx.verdict.decision, ctx.verdict.reasons = decide(ctx)
    if compared := against_deployment(ctx):
        ctx.verdict.reasons.append(compared)
    ctx.verdict.headline = headline(ctx)
    return StageResult(pb.STAGE_STATUS_OK, f"{to_id(pb.Decision, ctx.verdict.decision)}: {ctx.verdict.headline}")


def decide(ctx: RunContext) -> tuple[pb.Decision, list[str]]:
    unstable = _instability(ctx)
    if unstable:
        return pb.DECISION_ISOLATE, unstable
    missing = ctx.unsettled()
    if not missing:
        moot = sum(1 for item in CHECKLIST_IDS if _state(ctx, item) == MOOT)
        held = f"all {len(CHECKLIST_IDS) - moot} checklist items" + (" that apply" if moot else "")
        return pb.DECISION_FIX, [f"{held} hold: fix in place, one change at a time"]
    reasons = [f"no evidence yet for: {', '.join(missing)}"]
    if any(ctx.evidence.holders):
        holders = ", ".join(ctx.evidence.holder_notes[p] for p in sorted(frozenset().union(*ctx.evidence.holders)))
        reasons.insert(
            0, f"free the GPUs first: {holders}; launches that start with their memory held are not evidence"
        )
    if ctx.evidence.steps and not ctx.evidence.attempts:
        reasons.insert(
            0,
            "the failure did not reproduce on this runner: every stage and ladder step held, the deployment as "
            "written included",
        )
    return pb.DECISION_CONTINUE, reasons


def against_deployment(ctx: RunContext) -> str:
    """Whether this run met the failure the deployment's own log shows ("" when no log was given): the same
    failure (Attempt.same_as), a different one (a new candidate, both lines shown), or none."""
    if not ctx.request.HasField("deployment_error"):
        return ""
    wanted = ctx.request.deployment_error
    phase, category = to_id(pb.Phase, wanted.phase), to_id(pb.ErrorCategory, wanted.category)
    where = f"{'a phase the log does not show' if phase == UNKNOWN_PHASE else phase} [{category}]"
    attempts, steps = ctx.evidence.attempts, ctx.evidence.steps
    found = next((a for a in attempts if a.failed), None) or next((s.failure for s in steps if s.failure), None)
    if found is None:
        return f"the deployment's log fails in {where}; this run met no failure: not reproduced"
    if found.same_as(wanted):
        return f"the deployment's failure is reproduced: {where}, the same first error as in its log"
    return (
        f"a different failure, a new candidate: the deployment's log fails in {where} with {wanted.line!r}; "
        f"this run failed in {found.phase} [{found.category}] with {found.line or found.signature!r}"
    )


def _state(ctx: RunContext, item: str) -> pb.ChecklistState:
    return ctx.evidence.checklist.get(from_id(pb.ChecklistId, item), (PENDING, ""))[0]


def _instability(ctx: RunContext) -> list[str]:
    """What says the environment itself cannot be trusted (DESIGN §1, verdict: isolate)."""
    reasons: list[str] = []
    if len(set(ctx.evidence.holders)) > 1:
        seen = "; ".join(
            f"launch {n}: " + (", ".join(ctx.evidence.holder_notes[p] for p in sorted(pids)) or "none")
            for n, pids in enumerate(ctx.evidence.holders, 1)
        )
        reasons.append(f"GPU state changed under us: other processes holding GPU memory came and went ({seen})")
    drivers = list(dict.fromkeys(ctx.evidence.drivers))
    if len(drivers) > 1:
        reasons.append(f"the NVIDIA driver changed during the run ({' → '.join(drivers)}): it cannot be pinned here")
    images = list(dict.fromkeys(ctx.evidence.images))
    if len(images) > 1:
        moved = " → ".join(i.removeprefix("sha256:")[:12] for i in images)
        reasons.append(
            f"image {ctx.request.image} moved during the run ({moved}): what failed cannot be rolled back to"
        )
    # (an unknown phase is no phase: it cannot differ from the others)
    failed = [a for a in ctx.evidence.attempts if a.failed and a.phase != UNKNOWN_PHASE and not a.foreign]
    phases = list(dict.fromkeys(a.phase for a in failed))
    if len(phases) > 1:
        reasons.append(f"the same command fails at different phases from attempt to attempt: {', '.join(phases)}")
    image: dict[str, Any] | None = (ctx.evidence.fingerprint or {}).get("image")
    if image and image.get("id") and not image.get("repo_digests"):
        reasons.append(f"image {image.get('ref')} has no registry digest: it cannot be pinned or rolled back")
    return reasons


async def _first_error(ctx: RunContext) -> None:
    if _state(ctx, "first_error_saved") == HOLDS:
        return
    failure = next((s for s in ctx.evidence.steps if s.failure is not None), None)
    if failure is not None and failure.failure is not None:
        evidence = (
            f"ladder step {failure.step}: {failure.failure.phase} · {failure.failure.category} · {failure.detail}"
        )
        await ctx.check(pb.CHECKLIST_ID_FIRST_ERROR_SAVED, HOLDS, evidence)
    elif ctx.evidence.attempts:
        await ctx.check(pb.CHECKLIST_ID_FIRST_ERROR_SAVED, FAILS, "the launch exited without an error line")
    elif ctx.evidence.steps:
        await ctx.check(pb.CHECKLIST_ID_FIRST_ERROR_SAVED, MOOT, "nothing failed: every stage and ladder step held")


async def _prefix_caching(ctx: RunContext) -> None:
    step = next((s for s in ctx.evidence.steps if s.step == "prefix_caching"), None)
    if step is not None:
        state = MOOT if step.outcome == pb.LADDER_OUTCOME_NOT_APPLICABLE else HOLDS
        await ctx.check(
            pb.CHECKLIST_ID_PREFIX_CACHING_ISOLATED, state, f"{to_id(pb.LadderOutcome, step.outcome)}: {step.detail}"
        )
    elif ctx.evidence.attempts and ctx.plan.stable is None:  # the step was never carried out: nothing was isolated
        await ctx.check(pb.CHECKLIST_ID_PREFIX_CACHING_ISOLATED, MOOT, ISOLATED_BY_MINIMAL)


async def _oom(ctx: RunContext) -> None:
    attempts, steps = ctx.evidence.attempts, ctx.evidence.steps
    failures = [a for a in attempts if a.failed] + [s.failure for s in steps if s.failure is not None]
    secondary = next((a for a in failures if a.secondary_oom), None)
    holders = sorted(frozenset().union(*ctx.evidence.holders))
    if secondary is not None:
        cause = "memory held by other processes" if secondary.category == "oom" else secondary.category
        await ctx.check(
            pb.CHECKLIST_ID_OOM_NOT_SECONDARY, FAILS, f"the OOM in {secondary.phase} is secondary to {cause}"
        )
    elif holders:
        names = ", ".join(ctx.evidence.holder_notes[p] for p in holders[:5])
        await ctx.check(pb.CHECKLIST_ID_OOM_NOT_SECONDARY, FAILS, f"GPU memory held by other processes: {names}")
    elif failures or steps:
        if any(a.category == "oom" for a in failures):
            evidence = "the OOM is the first error and no other process held GPU memory"
            await ctx.check(pb.CHECKLIST_ID_OOM_NOT_SECONDARY, HOLDS, evidence)
        else:
            await ctx.check(pb.CHECKLIST_ID_OOM_NOT_SECONDARY, MOOT, "no OOM seen")


async def _revertible(ctx: RunContext) -> None:
    if ctx.plan.stable is not None:
        await ctx.check(pb.CHECKLIST_ID_REVERTIBLE_BASELINE, HOLDS, f"last stable: {shell_line(ctx.plan.stable)}")
    elif ctx.evidence.attempts:
        await ctx.check(
            pb.CHECKLIST_ID_REVERTIBLE_BASELINE, FAILS, "even the minimal launch fails: no stable configuration yet"
        )


async def _caches(ctx: RunContext) -> None:
    """caches_not_stale without a control launch (stages/cache_control.py settles it when one ran)."""
    if pb.CHECKLIST_ID_CACHES_NOT_STALE in ctx.evidence.checklist:
        return
    if ctx.evidence.attempts:
        await ctx.check(
            pb.CHECKLIST_ID_CACHES_NOT_STALE,
            MOOT,
            "no fresh-cache control: the failure was not in a phase that reads the caches, did not move between "
            "phases and was not met while a cache was read (runner/data/cache_control.toml)",
        )
    elif ctx.evidence.steps:
        await ctx.check(pb.CHECKLIST_ID_CACHES_NOT_STALE, MOOT, "no fresh-cache control: the minimal launch answered")


async def _repeated(ctx: RunContext) -> None:
    if ctx.evidence.attempts and all(a.foreign for a in ctx.evidence.attempts):
        await ctx.check(
            pb.CHECKLIST_ID_FAILURE_REPEATED,
            PENDING,
            "every attempt started while other processes held GPU memory: not evidence",
        )
        return
    attempts = [a for a in ctx.evidence.attempts if not a.foreign]
    if not attempts:
        return
    first = attempts[0]
    same = [a for a in attempts if a.same_as(first)]
    if len(attempts) < 2:
        await ctx.check(pb.CHECKLIST_ID_FAILURE_REPEATED, PENDING, "attempted once (engine.failure_attempts = 1)")
    elif len(same) == len(attempts):
        await ctx.check(
            pb.CHECKLIST_ID_FAILURE_REPEATED,
            HOLDS,
            f"{len(attempts)} of {len(attempts)} attempts failed in {first.phase} with the same first error",
        )
    else:
        seen = "; ".join(f"#{n}: {a.phase or 'no failure'}" for n, a in enumerate(attempts, 1))
        await ctx.check(
            pb.CHECKLIST_ID_FAILURE_REPEATED,
            FAILS,
            f"{len(same)} of {len(attempts)} attempts failed the same way ({seen})",
        )
