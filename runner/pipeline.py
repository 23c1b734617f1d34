"""The stage engine: runs the method's stages in order and always ends a run with one RunFinished."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from protos import runner_pb2 as pb
from protos.vocab import CHECKLIST_IDS, from_id, to_id
from runner.stages import freeze, minimal_launch, single_request
from runner.stages.context import RunContext, StageResult

log = logging.getLogger(__name__)

StageFn = Callable[[RunContext], Awaitable[StageResult]]
STAGES: tuple[tuple[pb.Stage, StageFn], ...] = (
    (pb.STAGE_FREEZE, freeze.run),
    (pb.STAGE_MINIMAL_LAUNCH, minimal_launch.run),
    (pb.STAGE_SINGLE_REQUEST, single_request.run),
)


async def execute(ctx: RunContext, cancel_reason: Callable[[], str]) -> None:
    """Runs the stages, releases the engine, and only then reports the run finished (nothing follows it)."""
    try:
        summary = await _stages(ctx)
        decision, reasons = _decide(ctx)
        finished = pb.RunFinished(status=pb.RUN_STATUS_COMPLETED, decision=decision, reasons=reasons, summary=summary)
    except asyncio.CancelledError:
        reason = cancel_reason()
        await ctx.emit(
            stage_finished=pb.StageFinished(stage=ctx.stage, status=pb.STAGE_STATUS_CANCELLED, summary=reason)
        )
        finished = pb.RunFinished(status=pb.RUN_STATUS_CANCELLED, reasons=[reason], summary=reason)
    except Exception as exc:
        log.exception("run %s failed", ctx.run_id)
        message = f"runner error in {to_id(pb.Stage, ctx.stage) or 'start'}: {type(exc).__name__}: {exc}"
        finished = pb.RunFinished(status=pb.RUN_STATUS_ERROR, reasons=[message], summary=message)
    await asyncio.shield(_release(ctx))
    await ctx.emit(run_finished=finished)


async def _release(ctx: RunContext) -> None:
    """Stops the engine and lets the log follower send the engine's last lines."""
    if ctx.engine is not None and ctx.engine.returncode is None:
        await ctx.engine.stop(ctx.config.engine.stop_grace_s)
    if ctx.follower is not None:
        await ctx.follower.drain(timeout_s=5.0)


async def _stages(ctx: RunContext) -> str:
    """Runs each stage; once one does not succeed, the rest are skipped. Returns the run's one-line summary."""
    stopped_at: StageResult | None = None
    stopped_stage: pb.Stage = pb.STAGE_UNSPECIFIED
    for stage, run_stage in STAGES:
        if stopped_at is not None:
            skipped = f"skipped: {to_id(pb.Stage, stopped_stage)} did not succeed"
            await ctx.emit(
                stage_finished=pb.StageFinished(stage=stage, status=pb.STAGE_STATUS_SKIPPED, summary=skipped)
            )
            continue
        ctx.stage = stage
        await ctx.emit(stage_started=pb.StageStarted(stage=stage))
        result = await run_stage(ctx)
        await ctx.emit(stage_finished=pb.StageFinished(stage=stage, status=result.status, summary=result.summary))
        if result.status != pb.STAGE_STATUS_OK:
            stopped_at, stopped_stage = result, stage
    if stopped_at is None:
        return "every stage succeeded"
    return f"{to_id(pb.Stage, stopped_stage)}: {stopped_at.summary}"


def _decide(ctx: RunContext) -> tuple[pb.Decision, list[str]]:
    """Without full evidence the only honest decision is `continue`, naming what is missing."""
    missing = [
        item
        for item in CHECKLIST_IDS
        if ctx.checklist.get(from_id(pb.ChecklistId, item), (0, ""))[0] != pb.CHECKLIST_STATE_HOLDS
    ]
    if missing:
        return pb.DECISION_CONTINUE, [f"no evidence yet for: {', '.join(missing)}"]
    return pb.DECISION_FIX, ["all ten checklist items hold"]
