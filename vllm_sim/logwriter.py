"""vLLM's output format: `(<proc> pid=<n>) ` on vLLM's lines, logger lines, bare tracebacks, bare uvicorn lines.

Every write is flushed at once so that a reader following the pipe sees progress as it happens.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO, Literal

from vllm_sim.clock import SimClock

Stream = Literal["stdout", "stderr"]
Role = Literal["api", "engine", "worker"]


@dataclass(frozen=True)
class Proc:
    name: str
    pid: int

    @property
    def prefix(self) -> str:
        return f"({self.name} pid={self.pid}) "


@dataclass(frozen=True)
class Procs:
    """The processes a real `vllm serve` runs: API server, engine core and one worker per TP rank.

    With tensor-parallel-size 1 vLLM runs the worker inside EngineCore, so there are no worker procs.
    """

    api: Proc
    engine: Proc
    workers: tuple[Proc, ...]

    @classmethod
    def for_tp(cls, tensor_parallel_size: int) -> Procs:
        api_pid = os.getpid()
        engine_pid = api_pid + 61  # the fake children get distinct pids near ours, as spawned ones would
        workers = (
            tuple(Proc(f"Worker_TP{rank}", engine_pid + 7 + rank) for rank in range(tensor_parallel_size))
            if tensor_parallel_size > 1
            else ()
        )
        return cls(Proc("APIServer", api_pid), Proc("EngineCore", engine_pid), workers)

    def of(self, role: Role, rank: int = 0) -> Proc:
        if role == "api":
            return self.api
        if role == "worker" and self.workers:
            return self.workers[rank]
        return self.engine


class LogWriter:
    def __init__(self, clock: SimClock, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self._clock = clock
        self._streams: dict[Stream, BinaryIO] = {"stdout": stdout, "stderr": stderr}

    def write(self, stream: Stream, text: str) -> None:
        """Raw text (a tqdm bar's pieces); everything else goes through the methods below."""
        out = self._streams[stream]
        try:
            out.write(text.encode("utf-8"))
            out.flush()
        except BrokenPipeError:  # the reader went away; vLLM would die of SIGPIPE, we just go quiet
            pass

    def log(self, proc: Proc, level: str, fileinfo: str, message: str) -> None:
        """A logger line; like vLLM's NewLineFormatter, every line of a multi-line message gets the header."""
        head = f"{proc.prefix}{level} {self._clock.now():%m-%d %H:%M:%S} [{fileinfo}] "
        self.write("stdout", "".join(f"{head}{line}\n" for line in message.split("\n")))

    def plain(self, proc: Proc, lines: Iterable[str], stream: Stream = "stderr") -> None:
        """Lines that bypass the logger (uncaught tracebacks, uvicorn): only the process prefix."""
        self.write(stream, "".join(f"{proc.prefix}{line}\n" for line in lines))

    def uvicorn(self, message: str, stream: Stream = "stderr") -> None:
        """uvicorn's own lines: vLLM 0.32 gives them no process prefix (its loggers are not vLLM's)."""
        self.write(stream, f"INFO:     {message}\n")
