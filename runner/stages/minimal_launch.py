"""minimal_launch: the model with only what it needs to load, followed phase by phase to the first error.

A failing minimal launch is attempted again (engine.failure_attempts in all): the same failure at the same
place is what "reproduced" means, and a failure that moves between phases says the environment is unstable.
A failure around CUDA graph capture gets one diagnostic relaunch with --enforce-eager (DESIGN §1): if that
launch answers, CUDA graphs are the trigger. A failure in engine_init, one that moves between phases, or one met
while a cache was read gets one control launch with fresh, empty caches (stages/cache_control.py).
"""

from __future__ import annotations

from kernel.analyzer import ErrorFinding
from protos import runner_pb2 as pb
from runner.stages import cache_control, proxies
from runner.stages.context import NOT_FAILED, Attempt, RunContext, StageResult
from runner.stages.launcher import launch, release, shell_line


async def run(ctx: RunContext) -> StageResult:
    minimal = ctx.command.minimal()
    line = shell_line(minimal)
    await ctx.artifact("minimal_command", line)
    await ctx.check(pb.CHECKLIST_ID_MINIMAL_COMMAND_ONE_LINE, pb.CHECKLIST_STATE_HOLDS, line)
    first = await launch(ctx, minimal, "minimal_launch")
    if first.error is not None:
        error = first.error
        evidence = f"{error.phase} · {error.category} · {error.line}"
        await ctx.check(pb.CHECKLIST_ID_FIRST_ERROR_SAVED, pb.CHECKLIST_STATE_HOLDS, evidence)
    if first.ready:
        return StageResult(pb.STAGE_STATUS_OK, first.summary)
    diagnosis = await _without_cuda_graphs(ctx, first.error) if first.error else ""
    target = first.failure or Attempt.inconclusive(first.summary)
    ctx.evidence.attempts.append(target)
    for number in range(2, ctx.config.engine.failure_attempts + 1):

        async def again(source: str = f"minimal_launch/attempt-{number}") -> Attempt:
            launched = await launch(ctx, minimal, source)
            return launched.failure or NOT_FAILED

        ctx.evidence.attempts.append(await proxies.repeat(ctx, target, again))
        if not ctx.evidence.attempts[-1].failed:  # it answered: the failure did not repeat
            break
    await cache_control.run(ctx, minimal)
    same = sum(1 for a in ctx.evidence.attempts if a.same_as(ctx.evidence.attempts[0]))
    summary = f"{first.summary} ({same} of {len(ctx.evidence.attempts)} attempts failed the same way)"
    return StageResult(pb.STAGE_STATUS_FAILED, f"{summary}; {diagnosis}" if diagnosis else summary)


async def _without_cuda_graphs(ctx: RunContext, error: ErrorFinding) -> str:
    """One diagnostic relaunch with --enforce-eager when the error came from CUDA graph capture."""
    if error.category != "cudagraph" and error.during != "cudagraph_capture":
        return ""
    eager = await launch(ctx, ctx.command.minimal().with_flag("--enforce-eager"), "minimal_launch/enforce-eager")
    verdict = (
        "with --enforce-eager the launch answers: CUDA graph capture is the trigger"
        if eager.ready
        else f"with --enforce-eager it still fails ({eager.summary}): CUDA graphs are not the only cause"
    )
    await ctx.artifact("enforce_eager_diagnostic", f"{verdict} — {eager.line}")
    ctx.evidence.diagnosis = verdict
    await release(ctx)
    return verdict
