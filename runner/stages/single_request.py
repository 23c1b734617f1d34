"""single_request: the fixed request, sent several times to the running server, recorded as it answers."""

from __future__ import annotations

import aiohttp

from protos import runner_pb2 as pb
from runner.stages.context import RunContext, StageResult
from runner.stages.requests import fixed_body, hang_of, send

DEFAULT_REPEATS = 3


async def run(ctx: RunContext) -> StageResult:
    body = fixed_body(ctx)
    repeats = ctx.request.request.repeats or DEFAULT_REPEATS
    results: list[pb.RequestResult] = []
    async with aiohttp.ClientSession() as http:
        for attempt in range(1, repeats + 1):
            result = await send(http, ctx, body, attempt)
            results.append(result)
            await ctx.emit(request_result=result)
            await hang_of(ctx, result)
            if ctx.follower is not None and ctx.follower.first_error.done():
                break
    return await _judge(ctx, results, repeats)


def describe(result: pb.RequestResult) -> str:
    return (
        f"HTTP {result.http_status or 'none'}, finish {result.finish_reason or '-'}, "
        f"{result.prompt_tokens} prompt → {result.completion_tokens} completion tokens (max_tokens {result.max_tokens})"
    )


async def _judge(ctx: RunContext, results: list[pb.RequestResult], repeats: int) -> StageResult:
    answered = [r for r in results if r.http_status == 200]
    outcomes = {(r.http_status, r.finish_reason, r.error) for r in results}
    described = describe(results[0])
    if len(results) == repeats and len(outcomes) == 1:
        await ctx.check(
            pb.CHECKLIST_ID_SINGLE_REQUEST_FIXED, pb.CHECKLIST_STATE_HOLDS, f"same answer {repeats}×: {described}"
        )
    if len(answered) == repeats:
        ctx.stable = ctx.running
        return StageResult(pb.STAGE_STATUS_OK, f"{repeats}/{repeats} answered: {described}")
    failed = next(r for r in results if r.http_status != 200)
    reason = failed.error or f"HTTP {failed.http_status}"
    return StageResult(
        pb.STAGE_STATUS_FAILED, f"{len(answered)}/{len(results)} answered; attempt {failed.attempt}: {reason}"
    )
