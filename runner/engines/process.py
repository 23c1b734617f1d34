"""Bare-metal engine: the launch command runs as a process in its own process group.

Only the executables runner.toml lists (`[engine] executables`, resolved to real paths when the config is
loaded) are run: argv[0] is looked up on PATH and resolved the same way, so neither a look-alike name
(`vllm-not-really`) nor a program in a scratch folder, nor a crafted bundle's rerun, runs anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from runner.clock import Clock
from runner.config import resolve_executable
from runner.engines.base import LogLine
from runner.fingerprint import PythonTarget
from runner.nvml import NvmlSource, PynvmlSource

RUN_ID_ENV = "K3REPRO_RUN_ID"  # marks every process we start, so a restarted runner can find leftovers
_LINE_LIMIT = 1 << 20


class ProcessEngine:
    def __init__(self, process: asyncio.subprocess.Process, clock: Clock) -> None:
        self._process = process
        self._clock = clock
        self._queue: asyncio.Queue[LogLine | None] = asyncio.Queue()
        self._readers = [
            asyncio.create_task(self._pump("stdout", process.stdout)),
            asyncio.create_task(self._pump("stderr", process.stderr)),
        ]

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    @property
    def image_id(self) -> str:
        return ""  # no container: the install on the host is what runs

    async def _pump(self, name: str, stream: asyncio.StreamReader | None) -> None:
        try:
            while stream is not None:
                raw = await stream.readline()
                if not raw:
                    break
                self._queue.put_nowait(LogLine(name, raw.decode("utf-8", "replace").rstrip("\r\n")))
        except ValueError:  # a line longer than the limit: keep what fits, continue
            self._queue.put_nowait(LogLine(name, "[line too long, truncated]"))
        finally:
            self._queue.put_nowait(None)

    async def lines(self) -> AsyncIterator[LogLine]:
        open_streams = len(self._readers)
        while open_streams:
            item = await self._queue.get()
            if item is None:
                open_streams -= 1
                continue
            yield item

    async def wait(self) -> int:
        return await self._process.wait()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to the whole group, SIGKILL after the grace period (a limit of the engine's clock);
        children never outlive us."""
        _signal_group(self._process.pid, signal.SIGTERM)
        exited = asyncio.ensure_future(self._process.wait())
        try:
            await self._clock.wait([exited], self._clock.limit(grace_s))
            _signal_group(self._process.pid, signal.SIGKILL)
            await exited
        finally:
            if not exited.done():  # the stop itself was cancelled: the group still goes, nothing is left pending
                _signal_group(self._process.pid, signal.SIGKILL)
                exited.cancel()
            for reader in self._readers:
                reader.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class ProcessBackend:
    name = "process"

    def __init__(
        self, nvml: NvmlSource | None = None, executables: tuple[str, ...] = (), clock: Clock | None = None
    ) -> None:
        self.nvml: NvmlSource = nvml or PynvmlSource()
        self.clock = clock or Clock()
        self.executables = frozenset(executables)  # real paths

    def refusal(self, argv: list[str]) -> str:
        program = argv[0] if argv else ""
        real = resolve_executable(program) if program else None
        if real is not None and real in self.executables:
            return ""
        where = f" ({real})" if real and real != program else ""
        allowed = ", ".join(sorted(self.executables)) or 'none: list them in runner.toml, e.g. executables = ["vllm"]'
        return f"executable {program!r}{where} is not one of this runner's [engine] executables ({allowed})"

    def probe_target(self, argv: list[str], image: str) -> PythonTarget | None:
        """The Python that runs the command: its program when that is a Python, else its shebang's."""
        program = shutil.which(argv[0]) if argv else None
        if program is None:
            return None
        if Path(program).name.startswith("python"):
            return PythonTarget(program)
        try:
            with open(program, "rb") as handle:
                first = handle.readline(256).decode("utf-8", "replace")
        except OSError:
            return None
        interpreter = first[2:].split()[0] if first.startswith("#!") and first[2:].split() else ""
        return PythonTarget(interpreter) if Path(interpreter).name.startswith("python") else None

    def environment(self, run_id: str) -> dict[str, str]:
        return {**os.environ, RUN_ID_ENV: run_id}

    def command(self, argv: list[str]) -> list[str]:
        return argv

    def remove_leftovers(self, run_ids: set[str]) -> int:
        return kill_leftovers(run_ids)

    async def launch(self, argv: list[str], *, run_id: str, image: str) -> ProcessEngine:
        if refusal := self.refusal(argv):  # checked at StartRun too; here nothing can slip past it
            raise PermissionError(refusal)
        process = await asyncio.create_subprocess_exec(
            *self.command(argv),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.environment(run_id),
            start_new_session=True,
            limit=_LINE_LIMIT,
        )
        return ProcessEngine(process, self.clock)


def process_groups(run_ids: set[str]) -> set[int]:
    """The process groups holding processes marked with one of `run_ids` (the env marker every launch gets)."""
    groups: set[int] = set()
    marks = {f"{RUN_ID_ENV}={run_id}".encode() for run_id in run_ids}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as handle:
                env = set(handle.read().split(b"\0"))
            if env & marks:
                groups.add(os.getpgid(int(entry.name)))
        except (OSError, ProcessLookupError):
            continue
    return groups


def kill_leftovers(run_ids: set[str]) -> int:
    """Kills the process groups of runs a previous runner process left unfinished."""
    groups = process_groups(run_ids)
    for pgid in groups:
        _signal_group(pgid, signal.SIGKILL)
    return len(groups)
