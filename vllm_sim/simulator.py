"""One simulated `vllm serve` from launch to exit: start-up, serving, engine death, signals.

Exit codes follow vLLM: 1 after a failed start-up or once the API server stops over a dead engine,
0 after SIGTERM / SIGINT (printing vLLM 0.32's `[shutdown]` markers, which tell a requested stop from a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import cast, get_args

from kernel.toml_reader import TomlReader
from vllm_sim.catalog import catalog
from vllm_sim.clock import SimClock
from vllm_sim.datafiles import reader
from vllm_sim.engine import Engine
from vllm_sim.failure import hang, write_failure
from vllm_sim.logwriter import LogWriter, Procs, Role
from vllm_sim.server import ApiServer
from vllm_sim.sizing import Facts
from vllm_sim.startup import Startup


@dataclass(frozen=True)
class UntimedLine:
    """A log.toml line written at a moment rather than on the start-up clock ([[shutdown]], [[engine_death_exit]])."""

    proc: Role
    text: str
    file: str = ""
    kind: str = "log"  # log | uvicorn
    level: str = "INFO"
    only: frozenset[str] = frozenset()


@cache
def untimed(table: str) -> tuple[UntimedLine, ...]:
    """One table of untimed lines, each row read by the typed reader (named by file, row and key when bad)."""
    return tuple(_untimed_line(row.only(_UNTIMED_KEYS)) for row in reader("log.toml").rows(table))


_UNTIMED_KEYS = ("proc", "text", "file", "kind", "level", "only")


def _untimed_line(row: TomlReader) -> UntimedLine:
    proc = row.text("proc")
    if proc not in get_args(Role):
        raise row.fail(f"'proc' must be one of {', '.join(get_args(Role))}, got {proc!r}")
    return UntimedLine(
        proc=cast(Role, proc),
        text=row.text("text"),
        file=row.text("file", ""),
        kind=row.text("kind", "log"),
        level=row.text("level", "INFO"),
        only=frozenset(row.texts("only")),
    )


async def simulate(facts: Facts, speed: float) -> int:
    """Runs the simulation; returns the exit code."""
    return await Simulator(facts, speed).run()


class Simulator:
    def __init__(self, facts: Facts, speed: float) -> None:
        self._facts = facts
        self._clock = SimClock(speed)
        self._log = LogWriter(self._clock, sys.stdout.buffer, sys.stderr.buffer)
        self._procs = Procs.for_tp(facts.settings.tensor_parallel_size)
        self._engine = Engine(facts, catalog(), self._log, self._procs, self._clock)
        self._server = ApiServer(self._engine, facts, catalog(), self._log, self._procs)
        self._sock: socket.socket | None = None
        self._listening = False

    async def run(self) -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        life = asyncio.create_task(self._live())
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({life, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if life.done():
            stopped.cancel()
            code = life.result()
        else:
            life.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await life
            self._write(untimed("shutdown"))
            code = 0
        if self._listening:
            await self._server.stop()
        if self._sock is not None:
            self._sock.close()
        return code

    async def _live(self) -> int:
        startup = Startup(self._facts, catalog(), self._log, self._procs, self._clock, self._bind, self._listen)
        failure = await startup.run()
        if failure is not None:
            values = {**self._facts.values(), **failure.values}
            multiproc = self._facts.multiproc
            if failure.effect == "hang":  # stuck where the error would strike; only an error given as text shows
                shown = [] if failure.spec.key else catalog().blocks(failure.spec, failure.rank, multiproc, values)
                await hang(shown, self._log, self._procs, failure.waits, failure.rank)
            blocks = catalog().blocks(failure.spec, failure.rank, multiproc, values, traceback=failure.traceback)
            await write_failure(blocks, self._log, self._procs, self._clock)
            return 1
        stats = None if self._facts.settings.disable_log_stats else asyncio.create_task(self._engine.log_stats())
        try:
            await self._engine.dead.wait()
            await self._clock.sleep(self._facts.scenario.timings.engine_death_exit)  # vLLM's watchdog
        finally:
            if stats is not None:
                stats.cancel()
        self._write(untimed("engine_death_exit"))
        return 1

    def _bind(self) -> None:
        """Binds like vLLM's create_server_socket, before the engine starts; listening comes later."""
        host = self._facts.settings.host
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, self._facts.settings.port))
        except OSError:
            sock.close()
            raise
        self._sock = sock

    async def _listen(self) -> None:
        assert self._sock is not None  # the script binds before it listens
        await self._server.start(self._sock)
        self._listening = True

    def _write(self, lines: Sequence[UntimedLine]) -> None:
        """Writes untimed log.toml lines (shutdown, exit) whose conditions hold now."""
        conditions = self._facts.conditions() | ({"listening"} if self._listening else set())
        values = {**self._facts.values(), "engine_pid": self._procs.engine.pid}
        for line in lines:
            if not line.only <= conditions:
                continue
            proc = self._procs.of(line.proc)
            text = line.text.format(**values)
            if line.kind == "uvicorn":
                self._log.uvicorn(text)
            else:
                self._log.log(proc, line.level, line.file, text)
