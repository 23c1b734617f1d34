"""The requests the method sends: the fixed request and its variants, one HTTP client for all of them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from kernel.analyzer import ErrorFinding, Stall
from protos import runner_pb2 as pb
from protos.vocab import API_PATHS, DEFAULT_API
from runner.stacks.collect import stalled_stacks
from runner.stages.context import RunContext

DEFAULT_BODY: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Reply with the word ready."}],
    "max_tokens": 64,
    "temperature": 0,
}
MAX_WARNINGS = 5
LOG_SETTLE_S = 0.05  # wall seconds the pipe may lag an answer (not the engine's time): the most it is waited
MAX_WARNING_CHARS = 500
FILLER = "The quick brown fox jumps over the lazy dog while the cluster keeps serving tokens."
# Answers that say OUR request was invalid (too long, unknown model, a feature the server was not started
# with): the server works, the probe does not; never a crash, never a trigger.
REFUSED_AS_INVALID = frozenset({400, 404, 413, 422})
TOKENS_PER_WORD_GUESS = 2.0  # when the server cannot count (no /tokenize): errs on the short side
SIZING_ROUNDS = 4
SIZED_WITHIN = 0.97  # a sized probe ends up between this share of its token budget and the budget


def api(ctx: RunContext) -> str:
    return ctx.request.request.api or DEFAULT_API


def fixed_body(ctx: RunContext) -> dict[str, Any]:
    raw = ctx.request.request.body_json
    body: dict[str, Any] = json.loads(raw) if raw else dict(DEFAULT_BODY)
    body.setdefault("model", ctx.command.served_model_name)
    return body


def with_text(ctx: RunContext, text: str) -> dict[str, Any]:
    """The fixed request with `text` as its input, in the same API form."""
    body = fixed_body(ctx)
    if api(ctx) == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


TOOL = {
    "type": "function",
    "function": {
        "name": "get_gpu_status",
        "description": "Report the status of one GPU of the cluster.",
        "parameters": {
            "type": "object",
            "properties": {"gpu": {"type": "integer", "description": "GPU index"}},
            "required": ["gpu"],
        },
    },
}
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "status",
        "schema": {"type": "object", "properties": {"ready": {"type": "boolean"}}, "required": ["ready"]},
    },
}


def with_tools(ctx: RunContext) -> dict[str, Any]:
    """The fixed request with a tool the model may call (agent traffic; needs --enable-auto-tool-choice)."""
    return {**fixed_body(ctx), "tools": [TOOL], "tool_choice": "auto"}


def with_json_schema(ctx: RunContext) -> dict[str, Any]:
    """The fixed request with a structured-output response format."""
    return {**fixed_body(ctx), "response_format": SCHEMA}


def filler(words: int, seed: str = "") -> str:
    base = FILLER.split()
    return " ".join([seed, *(base[i % len(base)] for i in range(words))]).strip()


def refused_as_invalid(result: pb.RequestResult) -> bool:
    return result.http_status in REFUSED_AS_INVALID


def headers(ctx: RunContext) -> dict[str, str]:
    """What a client of this deployment sends: its API key when the server was started with one."""
    command = ctx.session.running or ctx.command
    key = command.value("--api-key")
    return {"Authorization": f"Bearer {key}"} if isinstance(key, str) and key else {}


async def count_tokens(http: aiohttp.ClientSession, ctx: RunContext, body: dict[str, Any]) -> int | None:
    """The prompt's exact token count as the running server tokenizes it (vLLM's /tokenize), None if it cannot."""
    query = {"model": body.get("model", ctx.command.served_model_name)}
    query.update({k: body[k] for k in ("messages", "prompt") if k in body})
    try:
        async with http.post(
            f"{ctx.session.base_url}/tokenize",
            json=query,
            headers=headers(ctx),
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response:
            answer = await response.json(content_type=None) if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
        return None
    count = answer.get("count") if isinstance(answer, dict) else None
    return count if isinstance(count, int) else None


async def sized_body(
    http: aiohttp.ClientSession, ctx: RunContext, tokens: int, *, seed: str = "", tail: str = ""
) -> dict[str, Any]:
    """The fixed request with an input (seed, filler, tail) just under `tokens` prompt tokens, by the running
    server's own count: a probe that exceeds the context tests nothing but our arithmetic."""
    words = max(1, int(tokens / TOKENS_PER_WORD_GUESS))
    for _ in range(SIZING_ROUNDS):
        body = with_text(ctx, f"{filler(words, seed)} {tail}".strip())
        count = await count_tokens(http, ctx, body)
        if count is None or SIZED_WITHIN * tokens <= count <= tokens:
            return body
        words = max(1, int(words * tokens / count * SIZED_WITHIN))
    return with_text(ctx, f"{filler(words, seed)} {tail}".strip())


async def send(
    http: aiohttp.ClientSession, ctx: RunContext, body: dict[str, Any], attempt: int, before_mib: int | None = None
) -> pb.RequestResult:
    """One request; whatever happens becomes a RequestResult (status 0 when nothing answered), with the GPU
    memory in use before and after it and the warnings the engine logged meanwhile. `before_mib`: the memory
    read once before requests sent together, so that no read stands between them and they leave at once."""
    result = pb.RequestResult(attempt=attempt, max_tokens=int(body.get("max_tokens") or 0))
    result.gpu_memory_before_mib = await gpu_memory_in_use(ctx) if before_mib is None else before_mib
    session = ctx.session
    logged = len(session.follower.warnings) if session.follower is not None else 0
    path = API_PATHS[api(ctx)]
    answers = session.follower.answered(path) if session.follower is not None else 0
    clock = ctx.clock
    started = clock.now()
    timeout = aiohttp.ClientTimeout(total=clock.wall(clock.limit(ctx.config.engine.request_timeout_s)))
    try:
        async with http.post(f"{session.base_url}{path}", json=body, headers=headers(ctx), timeout=timeout) as response:
            result.http_status = response.status
            answer = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        answer = None
    result.latency_s = round(clock.now() - started, 3)  # the engine's seconds
    if isinstance(answer, dict):
        usage = answer.get("usage") or {}
        result.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        result.completion_tokens = int(usage.get("completion_tokens") or 0)
        choices = answer.get("choices") or [{}]
        result.finish_reason = str(choices[0].get("finish_reason") or "")
        if "error" in answer:
            error = answer["error"]
            result.error = str(error.get("message") if isinstance(error, dict) else error)
    result.gpu_memory_after_mib = await gpu_memory_in_use(ctx)
    if session.follower is not None:  # a line logged just before the answer may still be in the pipe
        await session.follower.until_answered(path, answers, LOG_SETTLE_S)
        result.warnings.extend(line[:MAX_WARNING_CHARS] for line in session.follower.warnings[logged:][:MAX_WARNINGS])
    return result


async def gpu_memory_in_use(ctx: RunContext) -> int:
    """MiB in use over all GPUs as NVML reports it; 0 when NVML cannot say."""
    view = await asyncio.to_thread(ctx.backend.nvml.read)
    return sum(gpu.memory_used_mib for gpu in view.gpus) if view.available else 0


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    text = await get_text(http, url)
    try:
        return json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None


async def get_text(http: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
            return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


def timed_out(result: pb.RequestResult) -> bool:
    """Nothing answered within request_timeout_s."""
    return not result.http_status and result.error.startswith("TimeoutError")


async def hang_of(ctx: RunContext, result: pb.RequestResult) -> ErrorFinding | None:
    """A request the server never answered within request_timeout_s is a hang, and the engine's finding (its
    last line besides vLLM's waiting messages says what it waited for); None for any other failure."""
    follower = ctx.session.follower
    if not timed_out(result) or follower is None:
        return None
    if follower.first_error.done():
        return None
    stall = Stall("request", ctx.config.engine.request_timeout_s, follower.analyzer.last_progress_line)
    stacks = await stalled_stacks(ctx, ctx.session.engine, follower.source)  # while the engine still waits
    finding: ErrorFinding = await follower.hang(stall, stacks)
    return finding
