"""The start-up log, phase by phase, on the simulated clock; it stops where the failure strikes.

The lines and their timing are data (vllm_sim/data/log.toml); this module walks them: it expands
per-rank lines, paces them over each phase's duration, draws tqdm bars, binds and opens the port when
the script says so, and stops before the line the failing process never writes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cache
from typing import Any

from kernel.toml_reader import TomlReader
from vllm_sim import bars
from vllm_sim.catalog import Catalog, ErrorSpec
from vllm_sim.clock import SimClock
from vllm_sim.datafiles import load, reader
from vllm_sim.jit_cache import compile_into, stale_error
from vllm_sim.logwriter import LogWriter, Proc, Procs, Role
from vllm_sim.scenario import STARTUP_PHASES
from vllm_sim.sizing import Facts


@dataclass(frozen=True)
class ScriptLine:
    id: str
    phase: str
    at: float
    proc: str  # api | engine | worker | rank0
    kind: str = "log"  # log | uvicorn | bar | routes | bind | listen
    level: str = "INFO"
    file: str = ""
    text: str = ""
    only: frozenset[str] = frozenset()
    until: float = 0.0
    style: str = ""
    total: str = ""


@cache
def script() -> tuple[ScriptLine, ...]:
    """log.toml's start-up lines, each row read by the typed reader (a bad one is named by file, row and key)."""
    return tuple(_script_line(row.only(_SCRIPT_KEYS)) for row in reader("log.toml").rows("startup"))


_SCRIPT_KEYS = tuple(field.name for field in fields(ScriptLine))


def _script_line(row: TomlReader) -> ScriptLine:
    return ScriptLine(
        id=row.text("id"),
        phase=row.text("phase"),
        at=row.number("at"),
        proc=row.text("proc"),
        kind=row.text("kind", "log"),
        level=row.text("level", "INFO"),
        file=row.text("file", ""),
        text=row.text("text", ""),
        only=frozenset(row.texts("only")),
        until=row.number("until", 0.0),
        style=row.text("style", ""),
        total=row.text("total", ""),
    )


@dataclass(frozen=True)
class Failure:
    """What ends the start-up: an error (or a hang) on a TP rank, and what its text needs besides the facts."""

    spec: ErrorSpec
    rank: int = 0
    values: Mapping[str, object] = field(default_factory=dict)
    effect: str = "crash"  # crash | hang
    traceback: bool = True
    waits: str = ""  # a hang: the collective the rank's process is stuck in (vllm_sim/workers/)


def planned_failure(facts: Facts, catalog: Catalog) -> Failure | None:
    """The start-up failure that strikes first; at the same point, the scenario's before natural ones.

    Decided before the first line, because every trigger (flags, host, model, the launch's draw) is known
    at launch.
    """
    conditions = facts.conditions()
    lines = [line for line in script() if line.only <= conditions]

    def when(spec: ErrorSpec) -> float:
        """Where in the log the error strikes: before its `at` line, else at the end of its phase."""
        at = [i for i, line in enumerate(lines) if line.id == spec.at]
        return at[0] if at else max(i for i, line in enumerate(lines) if line.phase == spec.phase) + 0.5

    def midway(spec: ErrorSpec) -> ErrorSpec:
        """An error given as text strikes halfway through its phase (at its end when the phase is one line)."""
        ids = [line.id for line in lines if line.phase == spec.phase]
        return spec if spec.at or (len(ids) + 1) // 2 >= len(ids) else replace(spec, at=ids[(len(ids) + 1) // 2])

    host, command = facts.scenario.host, facts.settings.command
    faults = [
        Failure(
            midway(catalog.spec(fault.error, fault.phase)),
            fault.rank,
            effect=fault.effect,
            traceback=fault.traceback,
            waits=fault.waits,
        )
        for fault in facts.scenario.faults
        if fault.phase in STARTUP_PHASES
        and catalog.spec(fault.error, fault.phase).only <= conditions
        and fault.when.launch_matches(command, host)
        and fault.strikes(host.seed, facts.launch)
    ]
    jit = facts.scenario.jit_cache
    if jit is not None and (stale := stale_error(jit, facts.launch)):  # read where engine_init loads its kernels
        faults.append(Failure(midway(catalog.spec(stale, "engine_init"))))
    candidates = [(when(f.spec), False, f) for f in faults]
    candidates += [(when(catalog.errors[e]), True, Failure(catalog.errors[e])) for e in facts.natural_errors()]
    return min(candidates, key=lambda c: c[:2])[2] if candidates else None  # stable: file order within a tie


class Startup:
    def __init__(
        self,
        facts: Facts,
        catalog: Catalog,
        log: LogWriter,
        procs: Procs,
        clock: SimClock,
        bind: Callable[[], None],
        listen: Callable[[], Awaitable[None]],
    ) -> None:
        self._facts = facts
        self._catalog = catalog
        self._log = log
        self._procs = procs
        self._clock = clock
        self._bind = bind
        self._listen = listen
        self._values = facts.values()

    async def run(self) -> Failure | None:
        """Writes the start-up log; returns the failure that stopped it, None once the API is up."""
        failure = planned_failure(self._facts, self._catalog)
        stop_at = failure.spec if failure else None
        conditions = self._facts.conditions()
        for phase in STARTUP_PHASES:
            start, duration = self._clock.elapsed(), self._facts.phase_seconds[phase]
            for line in script():
                if line.phase != phase or not line.only <= conditions:
                    continue
                if stop_at and line.id == stop_at.at:
                    return failure
                await self._clock.sleep_until(start + line.at * duration)
                bind_error = await self._write(line, start, duration)
                if bind_error:
                    return bind_error
            if stop_at and stop_at.phase == phase:
                return failure
            if phase == "engine_init" and self._facts.scenario.jit_cache is not None:
                compile_into(self._facts.scenario.jit_cache)  # its kernels, built into an empty (or its own) cache
        return None

    def _ranks(self, line: ScriptLine) -> list[tuple[Proc, int]]:
        if line.proc == "worker":
            return [(self._procs.of("worker", rank), rank) for rank in range(len(self._procs.workers) or 1)]
        role: Role = "api" if line.proc == "api" else "engine" if line.proc == "engine" else "worker"
        return [(self._procs.of(role, 0), 0)]

    async def _write(self, line: ScriptLine, start: float, duration: float) -> Failure | None:
        if line.kind == "bind":
            try:
                self._bind()
            except OSError as exc:
                code = exc.errno or errno.EADDRINUSE
                text = exc.strerror or os.strerror(code)
                return Failure(
                    self._catalog.errors["address_in_use"], values={"bind_errno": code, "bind_strerror": text}
                )
            return None
        if line.kind == "listen":
            await self._listen()
            return None
        for proc, rank in self._ranks(line):
            values: dict[str, Any] = {**self._values, "rank": rank}
            if line.kind == "log":
                self._log.log(proc, line.level, line.file, line.text.format(**values))
            elif line.kind == "uvicorn":
                self._log.uvicorn(line.text.format(**values))
            elif line.kind == "routes":
                for route in load("log.toml")["route"]:
                    self._log.log(proc, line.level, line.file, line.text.format(**route))
            elif line.kind == "bar":
                await self._bar(line, proc, values, start + line.at * duration, start + line.until * duration)
        return None

    async def _bar(self, line: ScriptLine, proc: Proc, values: Mapping[str, Any], t0: float, t1: float) -> None:
        """A tqdm bar on stderr, drawn over the simulated interval [t0, t1]."""
        desc, total = line.text.format(**values), int(values[line.total])
        steps = range(total + 1) if line.style == "shards" else [*range(0, total, 2), total]
        for n in steps:
            await self._clock.sleep_until(t0 + (t1 - t0) * n / total)
            elapsed = self._clock.elapsed() - t0
            if line.style == "shards":  # vLLM's bar_format ends in \n: every update is a line of its own
                self._log.write("stderr", f"{proc.prefix}\r{bars.shards(desc, n, total, elapsed)}\n")
            else:  # tqdm redraws in place: \r between updates, one \n at the end
                head = proc.prefix if n == 0 else ""
                self._log.write("stderr", f"{head}\r{bars.graph(desc, n, total, elapsed)}")
        if line.style == "shards":
            self._log.write("stderr", f"{proc.prefix}\r{bars.shards(desc, total, total, t1 - t0)}\n{proc.prefix}\n")
        else:
            self._log.write("stderr", "\n")
