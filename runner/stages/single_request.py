"""single_request: the fixed request, sent several times to the running server, recorded as it answers.

A request that kills the engine, fails while the server goes on serving (a 5xx with the engine's error logged),
or never comes back is the failure being reproduced, exactly like a launch failure: its first error is saved and
the minimal configuration is launched again and asked again (engine.failure_attempts in all), so whether it
repeats is decided by evidence. A request the server refuses as invalid (a 4xx) says the fixed request is wrong,
not the deployment: nothing is relaunched.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from kernel.analyzer import ErrorFinding, default_rules
from kernel.analyzer.signature import signature
from protos import runner_pb2 as pb
from protos.vocab import DEFAULT_REPEATS
from runner.stages import proxies
from runner.stages.context import NOT_FAILED, Attempt, RunContext, StageResult
from runner.stages.launcher import attempt_of, foreign_now, healthy_now, launch, not_reusable
from runner.stages.probes import fixed_body, hang_of, refused_as_invalid, send


async def run(ctx: RunContext) -> StageResult:
    body = fixed_body(ctx)
    repeats = ctx.request.request.repeats or DEFAULT_REPEATS
    results = await _ask(ctx, body, repeats)
    crash = await _engine_error(ctx, results)
    if crash is not None:
        serving = bool(ctx.session.base_url) and await healthy_now(ctx.session.base_url)
        return await _reproduce(ctx, body, crash, results, serving)
    return await _judge(ctx, results, repeats)


async def _ask(ctx: RunContext, body: dict[str, Any], repeats: int, first: int = 1) -> list[pb.RequestResult]:
    """Sends the fixed request up to `repeats` times; stops once the engine has logged its first error."""
    results: list[pb.RequestResult] = []
    async with aiohttp.ClientSession() as http:
        for attempt in range(first, first + repeats):
            result = await send(http, ctx, body, attempt)
            results.append(result)
            await ctx.emit(request_result=result)
            await hang_of(ctx, result)
            if (follower := ctx.session.follower) is not None and follower.first_error.done():
                break
    return results


async def _engine_error(ctx: RunContext, results: list[pb.RequestResult]) -> ErrorFinding | None:
    """The engine's first error behind a failed answer, once its log had a moment to show it."""
    follower = ctx.session.follower
    if follower is None or all(r.http_status == 200 or refused_as_invalid(r) for r in results):
        return None
    if not follower.first_error.done():
        await follower.wait_first_error()
    return follower.first_error.result() if follower.first_error.done() else None


async def _reproduce(
    ctx: RunContext, body: dict[str, Any], crash: ErrorFinding, results: list[pb.RequestResult], serving: bool
) -> StageResult:
    evidence = f"{crash.phase} · {crash.category} · {crash.line}"
    await ctx.check(pb.CHECKLIST_ID_FIRST_ERROR_SAVED, pb.CHECKLIST_STATE_HOLDS, evidence)
    target = attempt_of(ctx, crash)
    ctx.evidence.attempts.append(target)
    not_reusable(ctx)
    asked = [len(results)]
    for number in range(2, ctx.config.engine.failure_attempts + 1):

        async def again(source: str = f"single_request/attempt-{number}") -> Attempt:
            launched = await launch(ctx, ctx.command.minimal(), source)
            if not launched.ready:
                return launched.failure or Attempt.inconclusive(launched.summary)
            answers = await _ask(ctx, body, 1, first=asked[0] + 1)
            asked[0] += len(answers)
            error = await _engine_error(ctx, answers)
            if error is None:
                return NOT_FAILED
            not_reusable(ctx)
            return attempt_of(ctx, error)

        ctx.evidence.attempts.append(await proxies.repeat(ctx, target, again))
    same = sum(1 for a in ctx.evidence.attempts if a.same_as(ctx.evidence.attempts[0]))
    return StageResult(
        pb.STAGE_STATUS_FAILED,
        f"the fixed request {'fails (the server goes on serving)' if serving else 'kills the engine'}: "
        f"failed in {crash.phase} ({crash.category}): {crash.line} "
        f"({same} of {len(ctx.evidence.attempts)} attempts failed the same way)",
    )


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
        ctx.plan.stable = ctx.session.running
        proxies.answered(ctx)
        return StageResult(pb.STAGE_STATUS_OK, f"{repeats}/{repeats} answered: {described}")
    failed = next(r for r in results if r.http_status != 200)
    reason = failed.error or f"HTTP {failed.http_status}"
    if refused_as_invalid(failed):
        return StageResult(
            pb.STAGE_STATUS_FAILED,
            f"the server refuses the fixed request as invalid (HTTP {failed.http_status}: {reason}): "
            "fix the request in the cluster's config; the deployment was not tested",
        )
    # The server answered with an error and logged none: the answer is the evidence, repeated on one server.
    said = signature(default_rules(), "request", "request_error", reason)
    for result in results:
        if result.http_status != 200:
            ctx.evidence.attempts.append(
                Attempt("request", "request_error", said, foreign=foreign_now(ctx), proxy=ctx.session.running_proxies)
            )
    await ctx.check(pb.CHECKLIST_ID_FIRST_ERROR_SAVED, pb.CHECKLIST_STATE_HOLDS, f"request · request_error · {reason}")
    return StageResult(
        pb.STAGE_STATUS_FAILED, f"{len(answered)}/{len(results)} answered; attempt {failed.attempt}: {reason}"
    )
