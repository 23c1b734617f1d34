"""Launching an engine command and following it to readiness or its first failure (used by every launch)."""

from __future__ import annotations

import asyncio
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp

from kernel.analyzer import ErrorFinding
from kernel.clock import WALL
from kernel.redact import redactor
from kernel.vllm_cli import ServeCommand
from protos import runner_pb2 as pb
from runner.ports import PortReservation, listener_pids, process_line, reserve_port
from runner.stacks.collect import stalled_stacks
from runner.stages.context import Attempt, RunContext
from runner.stages.log_follower import LogFollower
from runner.stages.proxies import planned

# Seconds of the engine's clock (ctx.clock): the polls are pauses, the stops and the drain limits.
POLL_S = 0.25
DRAIN_POLL_S = 2.0
DRAIN_S = 5.0  # how long a stopped engine's output gets to end
# A launch that failed is stopped at once, after this long for the rest of its traceback (and a later OOM)
# to reach the log: vLLM often does not exit on SIGTERM after a start-up failure, and the grace period is
# GPU time spent on an engine that is already dead.
FAILED_STOP_S = 1.0
# On a scaled clock (the simulator's) the engine's time begins at its first line: before it, the host is starting a
# process (an interpreter, its imports), which takes wall time whatever the speed, and seconds of it when many
# launches start at once on a loaded host. So a scaled launch gets this long of the wall clock (or the stall limit,
# if longer) to write its first line, and its stall and ready limits count from that line.
PROCESS_START_WALL_S = 30.0
# The port each live launch holds (runner/ports.py), by RunContext id: held for the engine's life, freed by release.
_reserved: dict[int, PortReservation] = {}


@dataclass(frozen=True)
class Launch:
    command: ServeCommand  # as asked for, without the host and port the runner chose
    line: str  # the command as launched, redacted, one shell line
    ready: bool
    summary: str
    failure: Attempt | None = None  # how it failed: the first error, a hang, or an exit without one
    error: ErrorFinding | None = None


def attempt_of(ctx: RunContext, error: ErrorFinding) -> Attempt:
    return Attempt(
        error.phase,
        error.category,
        error.signature,
        error.secondary_oom,
        foreign=foreign_now(ctx),
        during=error.during,
        proxy=ctx.session.running_proxies,
        line=error.line,
        waits=follower.stacks[0] if (follower := ctx.session.follower) is not None and follower.stacks else "",
    )


def foreign_now(ctx: RunContext) -> bool:
    """Whether the engine now running (or last launched) started while others held GPU memory."""
    return bool(ctx.evidence.holders and ctx.evidence.holders[-1])


def shell_line(command: ServeCommand) -> str:
    return shlex.join(redactor().argv(command.argv()))


async def launch(ctx: RunContext, command: ServeCommand, source: str, fresh_caches: Path | None = None) -> Launch:
    """Stops the running engine (if any), starts `command` and follows it until it answers or fails.

    A failed launch is stopped at once: its first error is certain, waiting longer only costs GPU time.
    `fresh_caches`: the launch gets new, empty caches there (EngineBackend.launch), the host's are left alone.
    """
    await release(ctx)
    await _guard_gpu_memory(ctx)
    command, used = planned(ctx, command)
    source = f"{source}/proxy" if used else source
    host = ctx.config.engine.launch_host
    reservation = _reserved[id(ctx)] = await asyncio.to_thread(reserve_port, host)
    port = reservation.port
    launched = command.with_flag("--host", host).with_flag("--port", str(port))
    line = shell_line(launched)
    session = ctx.session
    session.launches += 1
    proxies = [pb.ProxyUsed(id=p.id, removes=p.removes) for p in used]
    await ctx.emit(launch_started=pb.LaunchStarted(source=source, line=line, proxies=proxies, number=session.launches))
    session.running_proxies = tuple(p.id for p in used)
    fresh = {"fresh_caches": fresh_caches} if fresh_caches is not None else {}  # only the control launch asks
    starting = asyncio.ensure_future(
        ctx.backend.launch(launched.argv(), run_id=ctx.run_id, image=ctx.request.image, **fresh)
    )
    try:
        session.engine = engine = await asyncio.shield(starting)
    except asyncio.CancelledError:  # cancelled while the engine was starting: stop what it started, then go
        await (await starting).stop(ctx.config.engine.stop_grace_s)
        _unreserve(ctx)
        raise
    if engine.image_id:
        ctx.evidence.images.append(engine.image_id)
    at = getattr(engine, "address", "") or host  # a backend whose engine says where it serves (a Pod's IP)
    session.base_url = base_url = f"http://{at}:{port}" if ":" not in at else f"http://[{at}]:{port}"
    session.follower = follower = LogFollower(engine, ctx.emit, source, ctx.clock, lambda: healthy_now(base_url))
    session.running = command
    ready, summary, failure = await _until_ready(ctx, follower)
    error = follower.first_error.result() if follower.first_error.done() else None
    if not ready:
        await release(ctx, grace_s=FAILED_STOP_S)
    if error is not None:
        failure = attempt_of(ctx, error)
    elif failure is not None:
        failure = replace(failure, foreign=foreign_now(ctx), proxy=session.running_proxies)
    return Launch(command, line, ready, summary, failure, error)


async def _guard_gpu_memory(ctx: RunContext) -> None:
    """Leftover processes holding GPU memory are what causes secondary OOMs: report them before a launch,
    wait (bounded) for them to drain when configured, and remember them so the launch is not taken as evidence."""
    deadline = ctx.clock.now() + ctx.config.engine.foreign_memory_wait_s
    while True:
        view = await asyncio.to_thread(ctx.backend.nvml.read)
        processes = view.processes if view.available else ()
        if not processes or ctx.clock.now() >= deadline:
            break
        await ctx.clock.poll(DRAIN_POLL_S)
    if view.available and view.driver_version:
        ctx.evidence.drivers.append(view.driver_version)
    per_pid: dict[int, list[int]] = {}
    for process in processes:
        per_pid.setdefault(process.pid, []).append(process.used_memory_mib)
        name = f" ({process.name})" if process.name else ""
        ctx.evidence.holder_notes[process.pid] = (
            f"pid {process.pid}{name} {sum(per_pid[process.pid])} MiB on {len(per_pid[process.pid])} GPU(s)"
        )
    ctx.evidence.holders.append(frozenset(per_pid))
    if per_pid:
        await ctx.artifact(
            "foreign_gpu_memory",
            {
                "note": "held by other processes when the launch started",
                "holders": [ctx.evidence.holder_notes[p] for p in per_pid],
            },
        )


async def release(ctx: RunContext, grace_s: float | None = None) -> None:
    """Stops the engine and lets its log follower send the last lines, so nothing arrives after the run ends.

    From here on the engine's log is the echo of our stop, not evidence (the follower is told so first)."""
    session = ctx.session
    if session.follower is not None:
        session.follower.stopping()
    if session.engine is not None and session.engine.returncode is None:
        grace = ctx.config.engine.stop_grace_s if grace_s is None else min(grace_s, ctx.config.engine.stop_grace_s)
        await session.engine.stop(grace)
    if session.follower is not None:
        await session.follower.drain(timeout_s=DRAIN_S)
    session.running = None
    _unreserve(ctx)  # the engine is stopped: its port may go to another launch


def not_reusable(ctx: RunContext) -> None:
    """The live engine logged a fatal error: it is not a server to reuse (the next step relaunches). It is left
    running, for its log to say the rest, until the next launch or the end of the run releases it."""
    ctx.session.running = None


def _unreserve(ctx: RunContext) -> None:
    if (reservation := _reserved.pop(id(ctx), None)) is not None:
        reservation.release()


def foreign_listener(engine: object, port: int) -> str:
    """Who other than `engine` serves `port`, in one line ("" when it is the engine's, or /proc cannot tell).

    The owner of the listening socket is read from /proc (net/tcp's inode, then the fds holding it) and matched
    against the engine's processes; a backend whose engine cannot say (`owns`) is taken at its word."""
    owns = getattr(engine, "owns", None)
    pids = listener_pids(port)
    if owns is None or not pids:
        return ""
    if any(owns(pid) for pid in pids):
        return ""
    pid = min(pids)
    return f"port {port} is served by pid {pid} ({process_line(pid)}), not by this launch's engine: not probed"


async def _until_ready(ctx: RunContext, follower: LogFollower) -> tuple[bool, str, Attempt | None]:
    engine_config, clock = ctx.config.engine, ctx.clock
    deadline = clock.now() + clock.limit(engine_config.ready_timeout_s)
    launched_at, begun = WALL.monotonic(), clock.speed == 1  # the wall clock's start-up is the engine's own time
    start_wall_s = max(PROCESS_START_WALL_S, clock.wall(clock.limit(engine_config.stall_timeout_s)))
    async with aiohttp.ClientSession() as http:
        while True:
            if not begun and (follower.lines_read or WALL.monotonic() - launched_at > start_wall_s):
                begun = True  # the engine's clock starts now (at its first line, or when its start-up ran out)
                deadline = clock.now() + clock.limit(engine_config.ready_timeout_s)
            if follower.first_error.done():
                error = follower.first_error.result()
                return False, f"failed in {error.phase} ({error.category}): {error.line}", None
            if follower.ended:
                if follower.first_error.done():
                    continue
                code = await ctx.session.engine.wait() if ctx.session.engine else None
                last = follower.tail[-1] if follower.tail else "(no output)"
                phase = follower.analyzer.phase or "container_init"
                return (
                    False,
                    f"engine exited with code {code} before the API answered; last line: {last}",
                    Attempt(phase, "other", f"exit {code} in {phase}"),
                )
            stall = await follower.stalled(clock.now(), clock.limit(engine_config.stall_timeout_s)) if begun else None
            if stall is not None:  # where each process waits, dumped while it still waits (before the stop)
                hang = await follower.hang(stall, await stalled_stacks(ctx, ctx.session.engine, follower.source))
                return False, f"failed in {hang.phase} ({hang.category}): {hang.line}", None
            if await healthy(http, ctx.session.base_url):
                port = int(ctx.session.base_url.rsplit(":", 1)[1])
                if foreign := await asyncio.to_thread(foreign_listener, ctx.session.engine, port):
                    phase = follower.analyzer.phase or "container_init"
                    return False, foreign, Attempt(phase, "other", f"port {port} served by another process")
                return True, f"API answered at {ctx.session.base_url} (/health 200)", None
            if begun and clock.now() > deadline:
                phase = follower.analyzer.phase or "container_init"
                return (
                    False,
                    f"not ready after {engine_config.ready_timeout_s:.0f} s",
                    Attempt(phase, "other", f"not ready in {phase}"),
                )
            await clock.poll(POLL_S, [follower.first_error])


async def healthy_now(base_url: str) -> bool:
    """Whether the server answers /health 200 now (a failed request may or may not have taken it down)."""
    async with aiohttp.ClientSession() as http:
        return await healthy(http, base_url)


async def healthy(http: aiohttp.ClientSession, base_url: str) -> bool:
    try:
        async with http.get(f"{base_url}/health", timeout=aiohttp.ClientTimeout(total=2)) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False
