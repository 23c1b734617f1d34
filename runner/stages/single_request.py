"""single_request: the fixed request, sent several times to the running server, recorded as it answers."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from protos import runner_pb2 as pb
from runner.stages.context import RunContext, StageResult

DEFAULT_REPEATS = 3
DEFAULT_BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Reply with the word ready."}],
    "max_tokens": 64,
    "temperature": 0,
}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def request_body(ctx: RunContext) -> dict[str, Any]:
    body: dict[str, Any] = (
        json.loads(ctx.request.request.body_json) if ctx.request.request.body_json else dict(DEFAULT_BODY)
    )
    body.setdefault("model", ctx.command.served_model_name)
    return body


async def run(ctx: RunContext) -> StageResult:
    fixed = ctx.request.request
    path = PATHS[fixed.api or "chat"]
    body = request_body(ctx)
    repeats = fixed.repeats or DEFAULT_REPEATS
    results: list[pb.RequestResult] = []
    async with aiohttp.ClientSession() as http:
        for attempt in range(1, repeats + 1):
            result = await _send(http, f"{ctx.base_url}{path}", body, attempt, ctx.config.engine.request_timeout_s)
            results.append(result)
            await ctx.emit(request_result=result)
            if ctx.follower is not None and ctx.follower.first_error.done():
                break
    return await _judge(ctx, results, repeats)


async def _send(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], attempt: int, timeout_s: float
) -> pb.RequestResult:
    result = pb.RequestResult(attempt=attempt, max_tokens=int(body.get("max_tokens") or 0))
    started = time.monotonic()
    try:
        async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            result.http_status = response.status
            answer = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        answer = None
    result.latency_s = round(time.monotonic() - started, 3)
    if isinstance(answer, dict):
        usage = answer.get("usage") or {}
        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.completion_tokens = int(usage.get("completion_tokens") or 0)
        choices = answer.get("choices") or [{}]
        result.finish_reason = str(choices[0].get("finish_reason") or "")
        if "error" in answer:
            error = answer["error"]
            result.error = str(error.get("message") if isinstance(error, dict) else error)
    return result


async def _judge(ctx: RunContext, results: list[pb.RequestResult], repeats: int) -> StageResult:
    answered = [r for r in results if r.http_status == 200]
    outcomes = {(r.http_status, r.finish_reason, r.error) for r in results}
    first = results[0]
    described = (
        f"HTTP {first.http_status or 'none'}, finish {first.finish_reason or '-'}, "
        f"{first.prompt_tokens} prompt → {first.completion_tokens} completion tokens (max_tokens {first.max_tokens})"
    )
    if len(results) == repeats and len(outcomes) == 1:
        await ctx.check(
            pb.CHECKLIST_ID_SINGLE_REQUEST_FIXED,
            pb.CHECKLIST_STATE_HOLDS,
            f"same answer {repeats}×: {described}",
        )
    if len(answered) == repeats:
        return StageResult(pb.STAGE_STATUS_OK, f"{repeats}/{repeats} answered: {described}")
    failed = next(r for r in results if r.http_status != 200)
    reason = failed.error or f"HTTP {failed.http_status}"
    return StageResult(
        pb.STAGE_STATUS_FAILED, f"{len(answered)}/{len(results)} answered; attempt {failed.attempt}: {reason}"
    )
