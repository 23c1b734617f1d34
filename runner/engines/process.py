"""Bare-metal engine: the launch command runs as a process in its own process group.

Only the executables runner.toml lists (`[engine] executables`, resolved to real paths when the config is
loaded) are run: argv[0] is looked up on PATH and resolved the same way, so neither a look-alike name
(`vllm-not-really`) nor a program in a scratch folder, nor a crafted bundle's rerun, runs anything else.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import shutil
import signal
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from kernel.clock import Clock
from kernel.toml_reader import packaged
from runner.config import resolve_executable
from runner.engines.base import LogLine
from runner.engines.fresh_caches import make_fresh
from runner.engines.lines import LineSplitter
from runner.fingerprint import PythonTarget
from runner.nvml import NvmlSource, PynvmlSource
from runner.stacks.dump import dump_pids
from runner.stacks.summary import ProcessDump

RUN_ID_ENV = "K3REPRO_RUN_ID"  # marks every process we start, so a restarted runner can find leftovers
LAUNCH_ENV = "K3REPRO_LAUNCH_ID"  # marks one launch's processes: stop finds those that left its process group
READ_SIZE = 1 << 16  # bytes a pump asks for at a time
AFTER_EXIT_S = 5.0  # once the engine exited, how long what it started gets to end (a limit of the engine's clock)
READ_DRAIN_S = 2.0  # once the launch is gone, how long the pumps get to read what was written (a limit)


class ProcessEngine:
    """A launched process and the pumps that read its output (runner/engines/lines.py: lines bounded, read on).

    `outputs` are the read ends the backend connected (stdout, stderr); without them, the process's own
    asyncio streams (started with stdout/stderr=PIPE). `marker` is the launch's LAUNCH_ENV value: what stop and
    the end of the launch kill besides its process group (a process that left it by setsid keeps the marker)."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        clock: Clock,
        outputs: tuple[Output, Output] | None = None,
        marker: str = "",
    ) -> None:
        self._process = process
        self._clock = clock
        self._marker = marker
        self._queue: asyncio.Queue[LogLine | None] = asyncio.Queue()
        if outputs is None:
            outputs = (Output("stdout", process.stdout), Output("stderr", process.stderr))
        self._readers = [asyncio.create_task(self._pump(output)) for output in outputs]
        self._ended = asyncio.create_task(self._after_exit())

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.returncode

    def owns(self, pid: int) -> bool:
        """Whether `pid` is this launch's: in its process group, or carrying its marker (left it by setsid)."""
        with contextlib.suppress(OSError, ProcessLookupError):
            if os.getpgid(pid) == self._process.pid:
                return True
        if not self._marker:
            return False
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                return f"{LAUNCH_ENV}={self._marker}".encode() in handle.read().split(b"\0")
        except OSError:
            return False

    def pids(self) -> list[int]:
        """The launch's live processes (API server, engine core, workers): those `owns` says are its own."""
        found = []
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and self.owns(pid := int(entry.name)) and not _zombie(pid):
                found.append(pid)
        return sorted(found)

    async def dump_stacks(self, limit_s: float) -> list[ProcessDump]:
        """py-spy dumps of every live process of the launch, all at once within `limit_s` (wall seconds)."""
        return await dump_pids(await asyncio.to_thread(self.pids), limit_s)

    @property
    def image_id(self) -> str:
        return ""  # no container: the install on the host is what runs

    async def _pump(self, output: Output) -> None:
        """Reads one stream until it ends (or the pump is cancelled), never pausing for an over-long line."""
        splitter = LineSplitter()
        try:
            while output.reader is not None and (data := await output.reader.read(READ_SIZE)):
                for text in splitter.feed(data):
                    self._queue.put_nowait(LogLine(output.name, text))
        finally:
            for text in splitter.close():
                self._queue.put_nowait(LogLine(output.name, text))
            if output.transport is not None:
                output.transport.close()
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

    async def _after_exit(self) -> None:
        """The engine exited by itself: what it started gets AFTER_EXIT_S to end and close its output, then
        whatever of the launch still runs is killed and the pumps read what is left, so neither a process nor a
        pipe outlives the launch (stop does the same, sooner)."""
        await self._process.wait()
        await self._wait_readers(AFTER_EXIT_S)
        self._signal(signal.SIGKILL)
        await self._close_readers()

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to the whole group (and to the launch's processes that left it), SIGKILL after the grace
        period (a limit of the engine's clock); children never outlive us, nor do the pipes' readers."""
        self._signal(signal.SIGTERM)
        exited = asyncio.ensure_future(self._process.wait())
        try:
            await self._clock.wait([exited], self._clock.limit(grace_s))
            self._signal(signal.SIGKILL)
            await exited
        finally:
            drain_s = READ_DRAIN_S
            if not exited.done():  # the stop itself was cancelled: the group still goes, nothing is left pending
                self._signal(signal.SIGKILL)
                exited.cancel()
                drain_s = 0.0
            self._ended.cancel()
            await asyncio.gather(self._ended, return_exceptions=True)
            await self._close_readers(drain_s)

    def _signal(self, sig: signal.Signals) -> None:
        _signal_group(self._process.pid, sig)
        if self._marker:
            for pgid in _marked_groups({f"{LAUNCH_ENV}={self._marker}".encode()}) - {os.getpgrp()}:
                _signal_group(pgid, sig)

    async def _wait_readers(self, limit_s: float) -> None:
        if limit_s > 0:
            await asyncio.wait(self._readers, timeout=self._clock.wall(self._clock.limit(limit_s)))

    async def _close_readers(self, drain_s: float = READ_DRAIN_S) -> None:
        """The launch is gone: the pumps read what it wrote (`drain_s` at most), then stop (a pipe that a stray
        process still holds is closed rather than waited on)."""
        try:
            await self._wait_readers(drain_s)
        finally:
            for reader in self._readers:
                reader.cancel()
            await asyncio.gather(*self._readers, return_exceptions=True)


@dataclass(frozen=True)
class Output:
    """One of the engine's output streams, as a pump reads it."""

    name: str  # "stdout" or "stderr"
    reader: asyncio.StreamReader | None
    transport: asyncio.BaseTransport | None = None  # the read end's, closed when the pump ends


async def _read_end(name: str, fd: int) -> Output:
    reader = asyncio.StreamReader()
    pipe = os.fdopen(fd, "rb", buffering=0)
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), pipe
    )
    return Output(name, reader, transport)


def _zombie(pid: int) -> bool:
    """Whether `pid` has exited and waits to be reaped (nothing to dump), or is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return True


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
        """The runner's variables that runner/data/engine_env.toml names (never its credentials), and the
        run's marker."""
        return {**engine_environment(os.environ), RUN_ID_ENV: run_id}

    def command(self, argv: list[str]) -> list[str]:
        return argv

    def scene_files(self) -> dict[str, str]:
        return {}

    def remove_leftovers(self, run_ids: set[str]) -> int:
        return kill_leftovers(run_ids)

    async def launch(
        self, argv: list[str], *, run_id: str, image: str, fresh_caches: Path | None = None
    ) -> ProcessEngine:
        if refusal := self.refusal(argv):  # checked at StartRun too; here nothing can slip past it
            raise PermissionError(refusal)
        marker = f"{run_id}.{secrets.token_hex(6)}"
        env = {**self.environment(run_id), LAUNCH_ENV: marker}
        if fresh_caches is not None:  # after the allowlist: the runner sets these itself
            env.update(await asyncio.to_thread(make_fresh, fresh_caches))
        # Our own pipes, not asyncio's: the process's wait() is then its exit alone, never the end of output
        # that a process which left the group may hold open; the pumps' read ends are closed by the engine.
        out, err = os.pipe(), os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *self.command(argv),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out[1],
                stderr=err[1],
                env=env,
                start_new_session=True,
            )
        except BaseException:
            os.close(out[0])
            os.close(err[0])
            raise
        finally:
            os.close(out[1])
            os.close(err[1])
        outputs = (await _read_end("stdout", out[0]), await _read_end("stderr", err[0]))
        return ProcessEngine(process, self.clock, outputs, marker)


def process_groups(run_ids: set[str]) -> set[int]:
    """The process groups holding processes marked with one of `run_ids` (the env marker every launch gets)."""
    return _marked_groups({f"{RUN_ID_ENV}={run_id}".encode() for run_id in run_ids})


def _marked_groups(marks: set[bytes]) -> set[int]:
    """The process groups holding a process whose environment has one of `marks` (b"NAME=value")."""
    groups: set[int] = set()
    if not marks:
        return groups
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


@functools.cache
def _environment_allowlist() -> tuple[frozenset[str], tuple[str, ...]]:
    data = packaged("engine_env.toml", "runner.data")
    return frozenset(data.texts("names", required=True)), tuple(data.texts("prefixes", required=True))


def engine_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` an engine is given: those runner/data/engine_env.toml names or prefixes."""
    names, prefixes = _environment_allowlist()
    return {name: value for name, value in environ.items() if name in names or name.startswith(prefixes)}
