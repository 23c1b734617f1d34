"""Follows a running engine's log: analyzes it line by line and streams findings and log chunks (redacted where
every event is, runner/events.py: nothing here leaves the runner any other way)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import replace

from kernel.analyzer import ErrorFinding, PhaseFinding, Stall, StreamAnalyzer
from kernel.analyzer.messages import first_error_message
from kernel.clock import Clock
from protos import runner_pb2 as pb
from protos.limits import LOG_CHUNK_BYTES
from protos.vocab import from_id
from runner.engines import RunningEngine
from runner.stages.context import Emit

CHUNK_LINES = 200  # a log chunk is sent when this many lines wait ...
CHUNK_INTERVAL_S = 1.0  # ... or this long after its first line, or before it would weigh LOG_CHUNK_BYTES
LINE_OVERHEAD_BYTES = 8  # what a line costs in a LogChunk besides its text (its tag and length)
ERROR_WAIT_S = 3.0  # after a failed answer, how long the engine's log gets to show why (a limit)
# How long a quiet log leaves open what the analyzer still holds (an error waiting for the line that places it or
# ends its message): an engine that logs its error and then hangs, as ranks waiting on a dead peer do, writes no
# such line, and its error must not wait for the stall limit.
QUIET_SETTLE_S = 3.0
# uvicorn's access line, written on stdout as the response starts, after every line vLLM (also on stdout) logged
# for the request: once it has been read, so have they (reference/vllm.md §2)
# possessive: a long line of non-spaces after a `"GET /` must not be re-scanned from every split (linear)
ACCESS_LINE = re.compile(r'"[A-Z]+ (?P<path>[^ ?"]++)\S*+ HTTP/[\d.]+" (?P<status>\d{3})')


class LogFollower:
    def __init__(
        self, engine: RunningEngine, emit: Emit, source: str, clock: Clock, serving: Callable[[], Awaitable[bool]]
    ) -> None:
        self.engine = engine
        self._serving = serving  # whether the server still answers /health (asked after a failed answer)
        self.clock = clock  # the engine's: the analyzer's progress times and every wait here count it
        self.analyzer = StreamAnalyzer(started_at=clock.now())
        self.first_error: asyncio.Future[ErrorFinding] = asyncio.get_running_loop().create_future()
        self.tail: deque[str] = deque(maxlen=50)
        self.warnings: list[str] = []  # every WARNING line, in order (requests report those logged meanwhile)
        self._emit = emit
        self.source = source
        self._stacks: tuple[str, ...] = ()  # a hang's: where the engine's processes waited (runner/stacks/)
        self._phase: str | None = None
        self._pending: list[str] = []
        self._pending_bytes = 0  # what the pending lines weigh in a LogChunk
        self._pending_since = 0.0
        self._last_line_at = clock.now()
        self._fed = 0  # lines given to the analyzer (its findings carry the line number)
        self._stop_line: int | None = None  # lines fed when the runner began to stop the engine
        self._answered: Counter[str] = Counter()  # access lines read, by request path
        self._access = asyncio.Event()  # set (and cleared) on each access line
        self._last_status = 0  # the status of the last answer the access log showed
        self._task = asyncio.create_task(self._follow())

    def stopping(self) -> None:
        """The runner is stopping the engine: what it logs from now on is the stop's echo (vLLM's shutdown
        path logs EngineDeadError tracebacks and "EngineCore failed to start."), never a finding; an error
        on a line logged before, that becomes certain only now, still is."""
        if self._stop_line is None:
            self._stop_line = self._fed

    @property
    def stacks(self) -> tuple[str, ...]:
        """A hang's: where the engine's processes waited, summary first (empty when no hang was dumped)."""
        return self._stacks

    @property
    def lines_read(self) -> int:
        """Lines the analyzer has been given (its progress times count from the latest)."""
        return self._fed

    @property
    def ended(self) -> bool:
        """True once the engine closed its output (it exited)."""
        return self._task.done()

    async def _follow(self) -> None:
        flusher = asyncio.create_task(self._flush_periodically())
        try:
            async for line in self.engine.lines():
                text = line.text
                self.tail.append(text)
                weight = len(text.encode("utf-8", "surrogatepass")) + LINE_OVERHEAD_BYTES
                if self._pending_bytes + weight > LOG_CHUNK_BYTES:  # a burst is cut in chunks under the gRPC limit
                    await self._flush()
                self._last_line_at = self.clock.now()
                if not self._pending:
                    self._pending_since = self._last_line_at
                self._pending.append(text)
                self._pending_bytes += weight
                if len(self._pending) >= CHUNK_LINES:
                    await self._flush()
                self._fed += 1
                for finding in self.analyzer.feed(text, at=self.clock.now()):
                    await self._found(finding)
                if self.analyzer.last_level == "WARNING":
                    self.warnings.append(text)
                if (access := ACCESS_LINE.search(text)) is not None:
                    self._answered[access["path"]] += 1
                    self._last_status = int(access["status"])
                    self._access.set()
                    self._access.clear()
            for finding in self.analyzer.close():
                await self._found(finding)
            await self._oom_seen_later()
        finally:
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            await self._flush()

    async def _flush_periodically(self) -> None:
        while True:
            await self.clock.poll(CHUNK_INTERVAL_S / 2)
            if self._pending and self.clock.now() - self._pending_since >= CHUNK_INTERVAL_S:
                await self._flush()
            if not self.first_error.done() and self.clock.now() - self._last_line_at >= QUIET_SETTLE_S:
                for finding in self.analyzer.settle():
                    await self._found(finding)

    async def _flush(self) -> None:
        if self._pending:
            lines, self._pending, self._pending_bytes = self._pending, [], 0
            await self._emit(log_chunk=pb.LogChunk(source=self.source, lines=lines))

    async def _found(self, finding: PhaseFinding | ErrorFinding) -> None:
        if isinstance(finding, PhaseFinding):
            if finding.phase != self._phase:
                self._phase = finding.phase
                await self._emit(
                    phase_reached=pb.PhaseReached(phase=from_id(pb.Phase, finding.phase), line=finding.line)
                )
            return
        if self.first_error.done() or (self._stop_line is not None and finding.line_no > self._stop_line):
            return  # a line logged after our stop began is its echo (a finding on an earlier line still counts)
        await self._flush()
        await self._emit(first_error=self._message(finding))
        self.first_error.set_result(finding)

    def _message(self, finding: ErrorFinding) -> pb.FirstError:
        message = first_error_message(finding)
        message.stacks.extend(self._stacks)
        return message

    def answered(self, path: str) -> int:
        """How many answers on `path` the log has shown (uvicorn's access lines read so far)."""
        return self._answered[path]

    async def until_answered(self, path: str, seen: int, timeout_s: float) -> None:
        """Waits until the log shows one more answer on `path` than `seen` (then every line the engine logged
        before it has been read), at most `timeout_s` wall seconds: without an access log, or when nothing
        answered, the whole time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._answered[path] <= seen and not self.ended and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._access.wait(), left)

    async def wait_first_error(self) -> None:
        """Gives the log a moment to show the first error behind a failed answer, then settles what the analyzer
        still holds open: a server that goes on serving writes no line that would.

        No moment is needed when the last answer the log showed is the failure (a 5xx access line: every line
        any process logged before it has been read) and the server still answers /health: nothing of that
        request is left to come."""
        if self.first_error.done():
            return
        all_read = self._last_status >= 500 and await self._serving()
        if not all_read and await self.clock.wait([self.first_error], self.clock.limit(ERROR_WAIT_S)):
            return
        for finding in self.analyzer.settle():
            await self._found(finding)

    async def stalled(self, now: float, threshold_s: float) -> Stall | None:
        """A hang (StreamAnalyzer.stalled), once what the analyzer still holds open is settled: a traceback that was
        the log's last line before the silence is the launch's first error, not the silence after it."""
        stall = self.analyzer.stalled(now, threshold_s)
        if stall is None:
            return None
        for finding in self.analyzer.settle():
            await self._found(finding)
        return None if self.first_error.done() else stall

    async def hang(self, stall: Stall, stacks: list[str] | None = None) -> ErrorFinding:
        """Reports a hang as this launch's first error (no progress is itself the finding), with `stacks`: where
        the engine's processes waited (runner/stacks/collect.py), when they were dumped."""
        if not self.first_error.done():
            self._stacks = tuple(stacks or ())
        await self._found(self.analyzer.hang_finding(stall))
        return self.first_error.result()

    async def _oom_seen_later(self) -> None:
        """An OOM after the first error makes it secondary; the thread learns it from an updated FirstError."""
        if not self.first_error.done():
            return
        reported = self.first_error.result()
        if self.analyzer.secondary_oom and not reported.secondary_oom:
            update = self._message(replace(reported, secondary_oom=True))
            update.update = True
            await self._emit(first_error=update)

    async def drain(self, timeout_s: float) -> None:
        """Waits for the stopped engine's output to end (then everything was sent); gives up after the limit
        timeout_s."""
        if not await self.clock.wait([self._task], self.clock.limit(timeout_s)):
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
