"""Follows one run's event stream into the store, and resumes with WatchRun after losing it.

A run has one RPC stream while nothing is lost: the StartRun that started it (`accept` keeps it open after the
first event, `follow_run` reads on from it); WatchRun only resumes a stream that was lost, or a run a bot that
stopped had started. Events are stored exactly once (UNIQUE(run_id, seq)); the callback sees each event once, in
order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from bot.config import BotConfig
from bot.refusal import Refused
from bot.runner_client import open_channel, rpc_error_text
from bot.store import AsyncStore, RunState, Store
from kernel.clock import WALL
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from protos.vocab import Decision, RunStatus, member

EventCallback = Callable[[pb.RunEvent], Awaitable[None]]
ReconnectCallback = Callable[[str], Awaitable[None]]
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
STREAM_IDLE_S = 60.0  # no event and no heartbeat for this long: the stream is dead even if TCP says otherwise


class RunRefused(Refused):
    """The runner did not accept a run it was sent (`accept`): nothing runs."""


class RunLost(Exception):
    """Contact with the runner was lost for longer than the config allows; the run is recorded as lost."""


@dataclass
class LiveStream:
    """The stream a run's StartRun opened, kept open after its first event (`accept`) for `follow_run` to read
    on from; whoever holds it and does not follow closes it."""

    channel: grpc.aio.Channel
    events: AsyncIterator[pb.RunEvent]

    async def close(self) -> None:
        await self.channel.close(None)


async def follow_run(
    config: BotConfig,
    store: AsyncStore,
    run_id: str,
    address: str,
    on_event: EventCallback,
    on_reconnect: ReconnectCallback | None = None,
    live: LiveStream | None = None,
) -> pb.RunFinished:
    """Streams the run until it finishes: on from `live` (the stream `accept` kept open), else over WatchRun."""
    try:
        return await _follow(config, store, run_id, address, on_event, on_reconnect, live)
    finally:
        if live is not None:
            await live.close()


async def _follow(
    config: BotConfig,
    store: AsyncStore,
    run_id: str,
    address: str,
    on_event: EventCallback,
    on_reconnect: ReconnectCallback | None,
    live: LiveStream | None,
) -> pb.RunFinished:
    lost_since: float | None = None
    attempt = 0

    def heard() -> None:  # any event, a heartbeat included: the runner is there
        nonlocal lost_since, attempt
        lost_since, attempt = None, 0

    while True:
        last_seq = await store.call(Store.last_seq, run_id)
        try:
            if live is not None:
                stream, live = live, None
                try:
                    finished = await _consume(store, run_id, stream.events, on_event, heard)
                finally:
                    await stream.close()
            else:
                async with open_channel(address, config.tls) as channel:
                    call = pb_grpc.RunnerStub(channel).WatchRun(pb.WatchRunRequest(run_id=run_id, after_seq=last_seq))
                    finished = await _consume(store, run_id, _until_idle(call), on_event, heard)
            if finished is not None:
                return finished
            problem = "the runner closed the stream before the run finished"
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                message = f"runner {address} no longer knows run {run_id} (its journal was lost)"
                await _record_error(store, run_id, RunState.LOST, message)
                raise RunLost(message) from None
            problem = rpc_error_text(exc)
        except TimeoutError:
            problem = f"no event or heartbeat for {STREAM_IDLE_S:.0f} s"
        lost_since = lost_since or WALL.monotonic()
        if WALL.monotonic() - lost_since > config.reconnect_for_s:
            message = f"lost contact with runner {address} for {config.reconnect_for_s:.0f} s: {problem}"
            await _record_error(store, run_id, RunState.LOST, message)
            raise RunLost(message)
        if on_reconnect is not None:
            await on_reconnect(problem)
        await WALL.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
        attempt += 1


async def _consume(
    store: AsyncStore,
    run_id: str,
    events: AsyncIterator[pb.RunEvent],
    on_event: EventCallback,
    heard: Callable[[], None],
) -> pb.RunFinished | None:
    """Stores and hands on each new event of one stream; the run's end, or None when the stream ended first."""
    async for event in events:
        heard()
        if event.WhichOneof("payload") == "heartbeat":
            continue
        stored = await store.call(Store.add_event, event)
        if stored is not None:  # redacted by the store: what Slack and the terminal show is what it keeps
            await on_event(stored)
        if event.WhichOneof("payload") == "run_finished":
            await _record_finish(store, run_id, event.run_finished)
            return event.run_finished
    return None


async def accept(config: BotConfig, address: str, request: pb.StartRunRequest) -> tuple[pb.RunEvent, LiveStream]:
    """Sends StartRun and waits for the run's first event: the runner has accepted the run; its stream stays open
    for `follow_run`. RunRefused: it did not, or it could not be asked (the runner checks the request before it
    journals anything, so nothing runs)."""
    channel = open_channel(address, config.tls)
    events = _until_idle(pb_grpc.RunnerStub(channel).StartRun(request))
    try:
        while True:
            event = await anext(events)
            if event.WhichOneof("payload") != "heartbeat":
                return event, LiveStream(channel, events)
    except grpc.aio.AioRpcError as exc:
        problem = f"runner {address} refused the run: {rpc_error_text(exc)}"
    except TimeoutError:
        problem = f"runner {address} sent no event for {STREAM_IDLE_S:.0f} s after StartRun"
    except StopAsyncIteration:
        problem = f"runner {address} closed the stream before the run's first event"
    except BaseException:
        await channel.close(None)
        raise
    await channel.close(None)
    raise RunRefused(problem)


async def _until_idle(call: AsyncIterable[pb.RunEvent]) -> AsyncIterator[pb.RunEvent]:
    iterator = aiter(call)
    while True:
        try:
            async with asyncio.timeout(STREAM_IDLE_S):
                event = await anext(iterator)
        except StopAsyncIteration:
            return
        yield event


async def _record_finish(store: AsyncStore, run_id: str, finished: pb.RunFinished) -> None:
    decision = member(Decision, finished.decision)
    status = member(RunStatus, finished.status)  # unset: no way the run ended that a view knows
    await store.call(
        Store.finish_run, run_id, RunState(status) if status else RunState.ERROR, finished.summary, decision
    )


async def _record_error(store: AsyncStore, run_id: str, status: RunState, message: str) -> None:
    await store.call(Store.finish_run, run_id, status, message)
