"""The stage engine: runs the method's stages in order and always ends a run with one RunFinished."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from protos import runner_pb2 as pb
from protos.vocab import to_id
from runner.stages import baseline, freeze, ladder, minimal_launch, minimize, single_request, verdict
from runner.stages.context import RunContext, StageResult
from runner.stages.launcher import release

log = logging.getLogger(__name__)

StageFn = Callable[[RunContext], Awaitable[StageResult]]
# A stage runs only while every stage before it succeeded; the verdict always runs, on whatever evidence exists.
STAGES: tuple[tuple[pb.Stage, StageFn], ...] = (
    (pb.STAGE_FREEZE, freeze.run),
    (pb.STAGE_BASELINE, baseline.run),
    (pb.STAGE_MINIMAL_LAUNCH, minimal_launch.run),
    (pb.STAGE_SINGLE_REQUEST, single_request.run),
    (pb.STAGE_LADDER, ladder.run),
)
# A minimize run freezes the scene it runs on, then shrinks the flag set; it reaches no decision of its own.
MINIMIZE_STAGES: tuple[tuple[pb.Stage, StageFn], ...] = (
    (pb.STAGE_FREEZE, freeze.run),
    (pb.STAGE_MINIMIZE, minimize.run),
)


async def execute(ctx: RunContext, cancel_reason: Callable[[], str]) -> pb.RunFinished:
    """Runs the stages and releases the engine; returns how the run finished, for the caller to report last
    (nothing may follow it, and the runner must already be free when a bot reads it)."""
    try:
        minimizing = ctx.request.HasField("minimize")
        summary = await _stages(ctx, MINIMIZE_STAGES if minimizing else STAGES)
        if not minimizing:
            await _run_stage(ctx, pb.STAGE_VERDICT, verdict.run)
        finished = pb.RunFinished(
            status=pb.RUN_STATUS_COMPLETED,
            decision=ctx.verdict.decision,
            reasons=ctx.verdict.reasons,
            summary=summary,
            headline=ctx.verdict.headline,
        )
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
    await asyncio.shield(release(ctx))
    finished.launches = ctx.session.launches
    return finished


async def _stages(ctx: RunContext, stages: tuple[tuple[pb.Stage, StageFn], ...]) -> str:
    """Runs each stage; once one does not succeed, the rest are skipped. Returns the run's one-line summary."""
    stopped_at: StageResult | None = None
    stopped_stage: pb.Stage = pb.STAGE_UNSPECIFIED
    for stage, run_stage in stages:
        if stopped_at is not None:
            skipped = f"skipped: {to_id(pb.Stage, stopped_stage)} did not succeed"
            await ctx.emit(
                stage_finished=pb.StageFinished(stage=stage, status=pb.STAGE_STATUS_SKIPPED, summary=skipped)
            )
            continue
        result = await _run_stage(ctx, stage, run_stage)
        if result.status != pb.STAGE_STATUS_OK:
            stopped_at, stopped_stage = result, stage
            ctx.stopped_at = (to_id(pb.Stage, stage), result.summary)
    if stopped_at is None:
        return "every stage succeeded"
    return f"{to_id(pb.Stage, stopped_stage)}: {stopped_at.summary}"


async def _run_stage(ctx: RunContext, stage: pb.Stage, run_stage: StageFn) -> StageResult:
    ctx.stage = stage
    await ctx.emit(stage_started=pb.StageStarted(stage=stage))
    result = await run_stage(ctx)
    await ctx.emit(stage_finished=pb.StageFinished(stage=stage, status=result.status, summary=result.summary))
    return result
