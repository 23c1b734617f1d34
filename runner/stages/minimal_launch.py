"""minimal_launch: the model with only what it needs to load, followed phase by phase to the first error."""

from __future__ import annotations

import asyncio
import shlex
import time

import aiohttp

from protos import runner_pb2 as pb
from runner.ports import free_port
from runner.redact import redactor
from runner.stages.context import RunContext, StageResult
from runner.stages.log_follower import LogFollower

POLL_S = 0.25


async def run(ctx: RunContext) -> StageResult:
    host = ctx.config.engine.launch_host
    port = free_port(host)
    command = ctx.command.minimal().with_flag("--host", host).with_flag("--port", str(port))
    line = shlex.join(redactor().argv(command.argv()))
    await ctx.artifact("minimal_command", line)
    await ctx.check(pb.CHECKLIST_ID_MINIMAL_COMMAND_ONE_LINE, pb.CHECKLIST_STATE_HOLDS, line)
    ctx.engine = await ctx.backend.launch(command.argv(), run_id=ctx.run_id, image=ctx.request.image)
    ctx.follower = follower = LogFollower(ctx.engine, ctx.emit, "minimal_launch")
    ctx.base_url = f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    result = await _until_ready(ctx, follower)
    if result.status != pb.STAGE_STATUS_OK:
        await ctx.engine.stop(ctx.config.engine.stop_grace_s)
    return result


async def _until_ready(ctx: RunContext, follower: LogFollower) -> StageResult:
    engine_config = ctx.config.engine
    deadline = time.monotonic() + engine_config.ready_timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            if follower.first_error.done():
                return await _failed(ctx, follower)
            if follower.ended:
                if follower.first_error.done():
                    return await _failed(ctx, follower)
                code = await ctx.engine.wait() if ctx.engine else None
                last = follower.tail[-1] if follower.tail else "(no output)"
                return StageResult(
                    pb.STAGE_STATUS_FAILED,
                    f"engine exited with code {code} before the API answered; last line: {last}",
                )
            stall = follower.analyzer.stalled(time.monotonic(), engine_config.stall_timeout_s)
            if stall is not None:
                return StageResult(
                    pb.STAGE_STATUS_FAILED,
                    f"hang: no progress in phase {stall.phase or 'start-up'} for {stall.idle_s:.0f} s; "
                    f"last line: {stall.last_line}",
                )
            if await _healthy(http, ctx.base_url):
                return StageResult(pb.STAGE_STATUS_OK, f"API answered at {ctx.base_url} (/health 200)")
            if time.monotonic() > deadline:
                return StageResult(pb.STAGE_STATUS_FAILED, f"not ready after {engine_config.ready_timeout_s:.0f} s")
            await asyncio.wait([follower.first_error], timeout=POLL_S)


async def _failed(ctx: RunContext, follower: LogFollower) -> StageResult:
    error = follower.first_error.result()
    evidence = f"{error.phase} · {error.category} · {error.line}"
    await ctx.check(pb.CHECKLIST_ID_FIRST_ERROR_SAVED, pb.CHECKLIST_STATE_HOLDS, evidence)
    return StageResult(pb.STAGE_STATUS_FAILED, f"failed in {error.phase} ({error.category}): {error.line}")


async def _healthy(http: aiohttp.ClientSession, base_url: str) -> bool:
    try:
        async with http.get(f"{base_url}/health", timeout=aiohttp.ClientTimeout(total=2)) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
