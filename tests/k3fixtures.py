"""Real parts for tests: dev certificates, an in-process runner daemon on loopback, a bot config, a TCP proxy."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bot.config import BotConfig, parse_bot_config
from bot.consumer import follow_run
from bot.coordinator import Coordinator, StartedRun
from bot.rerun import PlacedRerun, place_rerun, start_placed
from bot.store import AsyncStore
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from runner.config import parse_runner_config
from runner.daemon import RunnerDaemon

KIMI_LAUNCH = (
    "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8 --trust-remote-code --load-format fastsafetensors "
    "--max-model-len 1048576 --kv-cache-dtype fp8 --enable-prefix-caching --tool-call-parser kimi_k3 "
    "--enable-auto-tool-choice"
)


# The sim speed of a test whose timing is not what it checks: the engine's clock runs this much faster than the
# wall's, and the runner's waits follow it (its limits keep their wall slack, so a loaded machine is no hang). A
# start-up hang needs less (tests/test_scenarios.py): a launch's Python start-up is engine time too.
SIM_SPEED = 10000


def runner_data(
    certs: DevCerts | None, state: Path, *, scenario: str = "healthy", speed: float = SIM_SPEED, **extra: Any
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "gpu-test",
        "cluster": "cluster-a",
        "listen": "127.0.0.1:0",
        "state_dir": str(state),
        "allowed_images": ["vllm/vllm-openai:*"],
        "heartbeat_s": 0.5,
        "engine": {  # the sim backend's clock runs at the sim speed: the default limits are engine seconds
            "backend": "sim",
            "stop_grace_s": 2,
            "sim": {"scenario": scenario, "speed": speed},
        },
    }
    if certs is not None:
        data["tls"] = {"cert": str(certs.runner_cert), "key": str(certs.runner_key), "client_ca": str(certs.ca)}
    data.update(extra)
    return data


@contextlib.asynccontextmanager
async def running_runner(data: dict[str, Any]) -> AsyncIterator[RunnerDaemon]:
    daemon = RunnerDaemon(parse_runner_config(data, base=Path(data["state_dir"]), origin="test runner"))
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop("test finished", grace_s=1)


def bot_config(
    certs: DevCerts | None,
    store: Path,
    runners: list[str],
    *,
    launch: str = KIMI_LAUNCH,
    image: str = "vllm/vllm-openai:kimi-k3",
    request: dict[str, Any] | None = None,
    **extra: Any,
) -> BotConfig:
    data: dict[str, Any] = {
        "store": str(store),
        "connect_timeout_s": 3,
        "reconnect_for_s": 20,
        "clusters": {
            "cluster-a": {
                "runners": runners,
                "image": image,
                "launch": launch,
                "profile": "kimi-k3",
                "request": {
                    "api": "chat",
                    "repeats": 3,
                    "body": request or {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16},
                },
            }
        },
    }
    if certs is not None:
        data["tls"] = {"ca": str(certs.ca), "cert": str(certs.bot_cert), "key": str(certs.bot_key)}
    data.update(extra)
    return parse_bot_config(data, base=store.parent, origin="test bot")


@contextlib.asynccontextmanager
async def bot_core(certs: DevCerts, tmp_path: Path, runner: dict[str, Any], **bot: Any) -> AsyncIterator[Coordinator]:
    """The bot core (store `tmp_path/k3.db`) over mTLS to a fresh runner (`bot`: bot_config's options)."""
    async with running_runner(runner) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"], **bot)
        store = AsyncStore(config.store)
        try:
            yield Coordinator(config, store)
        finally:
            store.close()


async def ignore_event(_: pb.RunEvent) -> None:
    return None


async def finished_run(core: Coordinator, **start: Any) -> StartedRun:
    """A run on cluster-a started and followed to its end (`start`: Coordinator.start's options)."""
    started = await core.start("cluster-a", "U1", **start)
    await core.follow(started, ignore_event)
    return started


async def run_to_end(
    certs: DevCerts,
    tmp_path: Path,
    runner: dict[str, Any],
    image: str = "vllm/vllm-openai:kimi-k3",
    launch: str = KIMI_LAUNCH,
    request: dict[str, Any] | None = None,
    **start: Any,
) -> list[pb.RunEvent]:
    """Starts a run on a fresh runner through the bot core and returns every event it streamed."""
    async with bot_core(certs, tmp_path, runner, image=image, launch=launch, request=request) as core:
        events: list[pb.RunEvent] = []

        async def keep(event: pb.RunEvent) -> None:
            events.append(event)

        await core.follow(await core.start("cluster-a", "U1", **start), keep)
    return events


class TcpProxy:
    """Forwards loopback TCP to a target; `cut()` drops every live connection, as a flaky network would."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for writer in self._writers:
            transport = writer.transport
            transport.abort()
        self._writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def rerun_left_running(core: Coordinator, original: str) -> PlacedRerun:
    """What a bot that dies mid-rerun leaves: the rerun placed and started, its run going on, nothing following
    it and nothing released (the follower is cancelled once the minimal launch has started)."""
    placed = await place_rerun(core, original, "U-OPS")
    launching = asyncio.Event()

    async def watch(event: pb.RunEvent) -> None:
        if event.HasField("stage_started") and event.stage_started.stage == pb.STAGE_MINIMAL_LAUNCH:
            launching.set()

    live = await start_placed(core, placed, watch)
    follower = asyncio.create_task(
        follow_run(core.config, core.store, placed.run_id, placed.placement.address, watch, live=live)
    )
    await launching.wait()
    follower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follower
    return placed
