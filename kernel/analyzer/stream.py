"""The incremental first-error analyzer: fed one line at a time, it reports phases at once and the first
error as soon as it is certain.

One loop feeds separate parts, each with one concern (the rules themselves are data, see rules.toml):
- traceback.TracebackTracker: every output stream's traceback state (start, frames, exception, message);
- arbiter.Arbiter and its intake arbiter.ErrorLines: the candidates and which one is the first error;
- classify.Classifier: which rule names a line; the first error's category, hint and reasons;
- phases.PhaseTracker: markers, contexts, readiness and a deliberate stop ([stop]: a serving server stopped on
  purpose ends the search, what follows is the stop's echo); phases.Placer: the phase of an error.
This class owns the public API: the line count, hangs (stalled), what whole-file analysis may jump over
(watch) and the reasons beyond the finding (explain).
"""

from __future__ import annotations

import re

from kernel.analyzer.arbiter import Arbiter, ErrorLines
from kernel.analyzer.candidates import GENERIC, Candidate, Cursor
from kernel.analyzer.classify import Classifier
from kernel.analyzer.findings import ErrorFinding, PhaseFinding, Stall, Watch
from kernel.analyzer.lines import LineParser
from kernel.analyzer.phases import PhaseTracker, Placer
from kernel.analyzer.rules import Marker, Rules, default_rules
from kernel.analyzer.signature import signature
from kernel.analyzer.traceback import CONTEXT_BEFORE, Frames, Stream, TracebackTracker
from kernel.clock import WALL

__all__ = ["CONTEXT_BEFORE", "ErrorFinding", "PhaseFinding", "Stall", "StreamAnalyzer", "Watch"]

# watch(): first error still open; markers and other patterns whose lines count anywhere; later OOMs
# count; wrappers count (--explain lists the first few)
_WatchKey = tuple[bool, tuple[Marker, ...], tuple[re.Pattern[str], ...], bool, bool]


class StreamAnalyzer:
    """Feed lines as they arrive; read `phase`, `first_error`, `healthy`; ask `stalled()` for hangs."""

    def __init__(self, rules: Rules | None = None, *, started_at: float | None = None) -> None:
        self.rules = rules = rules or default_rules()
        self._parser = LineParser(rules.line)
        self._cursor = cursor = Cursor()
        self._phases = phases = PhaseTracker(rules, cursor)
        placer = Placer(rules, phases)
        classifier = Classifier(rules, placer, phases)
        self._arbiter = arbiter = Arbiter(rules, cursor, phases, placer, classifier)
        frames = Frames(rules, arbiter, phases)
        intake = ErrorLines(rules, cursor, phases, placer, classifier, arbiter, frames)
        self._tracker = TracebackTracker(rules, cursor, phases, arbiter, frames, intake)
        self._closed = False
        self._last_progress_at = WALL.monotonic() if started_at is None else started_at
        self._last_line = ""
        self.last_level: str | None = None  # the log level of the line fed last (None: no log header)
        self.last_progress_line = ""  # the last line that was not one of vLLM's waiting messages
        self._watch_cache: dict[_WatchKey, Watch] = {}

    # -- public state ---------------------------------------------------------------------------

    @property
    def phase(self) -> str | None:
        """The phase the markers have reached (None before the first marker)."""
        return self._phases.phase

    @property
    def phases_seen(self) -> tuple[str, ...]:
        return tuple(self._phases.seen)

    @property
    def first_error(self) -> ErrorFinding | None:
        return self._arbiter.first_error

    @property
    def healthy(self) -> bool:
        """Ready (`Application startup complete.` or an offline engine's readiness) and no error so far."""
        arbiter = self._arbiter
        return self._phases.ready and arbiter.first_error is None and arbiter.best is None and not arbiter.open

    @property
    def ready(self) -> bool:
        return self._phases.ready

    @property
    def secondary_oom(self) -> bool:
        """Whether the first error's OOM is secondary, with everything seen so far (it can turn true
        after the ErrorFinding was emitted, when an OOM follows a different first error)."""
        emitted, error = self._arbiter.emitted, self._arbiter.first_error
        if emitted is None or error is None:
            return False
        return self._arbiter.secondary(emitted, error.category)

    @property
    def _emitted(self) -> Candidate | None:
        """The candidate reported as the first error (scan.py re-reads the lines before it)."""
        return self._arbiter.emitted

    @property
    def lines(self) -> int:
        return self._cursor.n

    @property
    def stopped(self) -> bool:
        """A serving run was stopped on purpose ([stop]): later errors are its echo."""
        return bool(self._phases.stopped_at)

    def explain(self) -> tuple[str, ...]:
        """Why the result is what it is beyond the finding's own reasons (ErrorFinding.why): the stop
        that ended the search, the wrappers passed over."""
        phases = self._phases
        out = []
        if phases.stopped_at:
            out.append(
                f"stop: line {phases.stopped_at} stopped a serving server on purpose ({phases.stop_line}); "
                f"{phases.echoes} error line(s) after it are the stop's echo, not failures"
            )
        error = self._arbiter.first_error
        reported = error.line_no if error else 0
        out += [text for line_no, text in self._arbiter.demoted if line_no != reported]
        return tuple(out)

    # -- whole-file analysis --------------------------------------------------------------------

    def watch(self) -> Watch | None:
        """For whole-file analysis, which jumps over lines: None while every line must be read (a
        traceback, message or header is open, or the rules have no needles); else the literals a line
        must contain to change the result from here on."""
        arbiter, phases = self._arbiter, self._phases
        if self.rules.scan is None or arbiter.open:
            return None
        # Whether every stream is settled first: inside a traceback (most calls that return None) the key
        # is not needed.
        if arbiter.first_error is None:
            if not self._tracker.settled(Stream.is_idle):
                return None
            # What the phase tracker looks for: the markers that can still change something (an excerpt
            # without readiness repeats a seen phase's marker on every access line), the contexts' next edges
            # and, while serving, a stop notice (a line a serving log repeats then costs one read, not one per
            # repetition).
            edges = phases.edges()
            if phases.stop_armed():
                assert self.rules.stop is not None
                edges += (self.rules.stop,)
            key: _WatchKey = (True, phases.active_markers, edges, False, False)
        else:
            # Only a later OOM (secondary_oom), one of the first few wrappers (--explain lists them; neither
            # in a suppressed traceback) and markers of phases not seen yet can still count. While a phase is
            # unseen every marker that can move the phase matters: on a line with several markers the first
            # active one wins.
            emitted = arbiter.emitted
            oom = arbiter.later_oom and emitted is not None and emitted.tier <= GENERIC and not self.secondary_oom
            wrappers = arbiter.listing_wrappers()

            def ok(st: Stream) -> bool:
                return not ((oom or wrappers) and st.suppress)

            if not self._tracker.settled(ok):
                return None
            unseen = any(m.phase not in phases.seen for m in self.rules.markers)
            markers = phases.active_markers if unseen else ()
            key = (False, markers, (), oom, wrappers)
        found = self._watch_cache.get(key)
        if found is None:
            found = self._watch_cache[key] = self._needles(key)
        return found

    def _needles(self, key: _WatchKey) -> Watch:
        scan = self.rules.scan
        assert scan is not None
        first, markers, edges, oom, wrappers = key
        any_line = frozenset[str]().union(*map(scan.of, [*(m.pattern for m in markers), *edges]))
        if first:
            return Watch(any_line, scan.errors)
        return Watch(any_line, (scan.oom if oom else frozenset()) | (scan.wrappers if wrappers else frozenset()))

    def skip(self, count: int) -> None:
        """Count lines that watch() said cannot change the result, without reading them."""
        self._cursor.n += count

    @property
    def holds_logged_error(self) -> bool:
        """For whole-file analysis: nothing failed, is open or stopped the search, and a logged error line is held
        (the first error unless a stronger one comes). A later line at an error level then changes the result only
        as the header of a traceback that follows it, or by the frames it names (kernel.analyzer.scan)."""
        arbiter = self._arbiter
        return arbiter.first_error is None and not arbiter.open and not self._phases.stopped_at and bool(arbiter.weak)

    # -- hangs ----------------------------------------------------------------------------------

    def stalled(self, now: float, threshold_s: float) -> Stall | None:
        """A hang: no progress line for threshold_s (lines vLLM repeats while waiting do not count).

        None once the run is ready or failed: then there is nothing left to wait for in the log.
        """
        if self._phases.ready or self._arbiter.first_error is not None:
            return None
        idle = now - self._last_progress_at
        if idle < threshold_s:
            return None
        return Stall(self._phases.phase, idle, self._last_line)

    def hang_finding(self, stall: Stall) -> ErrorFinding:
        """A hang as the launch's first error: where it stopped, and what its last line says it waited for."""
        phase = stall.phase or "container_init"
        rule = next((h for h in self.rules.hangs if h.pattern.search(stall.last_line)), None)
        category = rule.category if rule else self.rules.category_by_phase.get(phase, self.rules.default_category)
        return ErrorFinding(
            phase=phase,
            category=category,
            line=f"hang: no progress in {phase} for {stall.idle_s:.0f} s; last line: {stall.last_line or '(none)'}",
            line_no=self._cursor.n,
            context=(stall.last_line,),
            secondary_oom=False,
            signature=signature(self.rules, phase, category, "hang"),
            hint=(rule.hint if rule else "") or self.rules.category_hint(category),
            during="hang",
        )

    # -- feeding --------------------------------------------------------------------------------

    def feed(self, line: str, at: float | None = None) -> list[PhaseFinding | ErrorFinding]:
        """Analyze one line (a trailing newline is fine; embedded newlines split it)."""
        if self._closed:
            raise RuntimeError("feed() after close()")
        if "\n" in line.rstrip("\n"):
            found: list[PhaseFinding | ErrorFinding] = []
            for part in line.rstrip("\n").split("\n"):
                found += self.feed(part, at)
            return found
        self._cursor.n += 1
        out: list[PhaseFinding | ErrorFinding] = []
        self._phases.saw_idle = False
        for ll in self._parser.lines(line):  # (one, but for a paste that joined lines: all on this line's number)
            self._tracker.line(ll, out)
        if not self._phases.saw_idle:
            self._last_progress_at = WALL.monotonic() if at is None else at
            self.last_progress_line = ll.display
        self._last_line = ll.display
        self.last_level = ll.level
        arbiter = self._arbiter
        if arbiter.open:
            arbiter.expire(self._tracker.streams)
        if arbiter.first_error is None and arbiter.best is not None:
            self._emit(out)
        return out

    def settle(self) -> list[PhaseFinding | ErrorFinding]:
        """The log went quiet with something still uncertain (a traceback or a message no later line ended):
        settle it as if the lines that end it had passed, and report the first error that makes. A serving
        engine writes nothing after a failed request's traceback until its next stats line, so the line count
        that settles a candidate in a busy log may never come. Lines fed later are read as before."""
        out: list[PhaseFinding | ErrorFinding] = []
        arbiter = self._arbiter
        if self._closed or arbiter.first_error is not None or not arbiter.open:
            return out
        arbiter.expire(self._tracker.streams, force=True)
        if arbiter.first_error is None and arbiter.best is not None:
            self._emit(out, force=True)
        return out

    def close(self) -> list[PhaseFinding | ErrorFinding]:
        """End of the log: settle what was still uncertain and report the first error if not yet done."""
        if self._closed:
            return []
        self._closed = True
        finding = self._arbiter.close(self._tracker.streams.values())
        return [finding] if finding is not None else []

    def _emit(self, out: list[PhaseFinding | ErrorFinding], force: bool = False) -> None:
        finding = self._arbiter.emit(self._tracker.streams.values(), force=force)
        if finding is not None:
            out.append(finding)
