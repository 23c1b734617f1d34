"""The incremental first-error analyzer: fed one line at a time, it reports phases at once and the first
error as soon as it is certain.

How the first error is chosen (the rules themselves are data, see rules.toml):
- Every output stream (process prefix + logger call site) has its own traceback state, so interleaved
  ranks and processes do not mix their frames.
- Candidates, strongest first: a line a root rule names (certain at once); an exception that ends a
  traceback, or an exception-shaped line, that no rule names (certain when its message stops
  continuing: at most `max_message_lines` lines of its stream or `max_wait_lines` lines overall);
  a logged ERROR line without a traceback (only at close()); a wrapper (only at close(), only when
  there is nothing else).
- Among strong candidates the earliest line wins; a later one is not reported while an earlier one is
  still uncertain. A logged ERROR line followed by a traceback holds its place until the traceback ends
  (at most `header_wait_lines`): it is the root-cause line when it repeats the exception's message.
- Wrappers quote or follow the cause: when one is all there is, the cause it quotes (`Worker failed with
  error '...'`, `RayTaskError(DistBackendError)`) is classified by the root rules.
- Phase of the error: the rule's phase when only one is possible; `request` once the server was ready;
  else the outermost traceback frame that places it (an exception without one waits for the traceback
  chained to it), else the logger's module, else a worker method its line names, a collective's sequence
  number or a request id, else the phase the markers reached, else a wrapper or marker right after it that
  says where the run was (EngineDeadError: serving), else, when its traceback or a wrapper shows the engine
  starting, where the rule's error happens in a start-up, else a compile-class rule's phase; else `unknown`
  (such an error waits up to `max_wait_lines` lines for a line that places it). Markers lag behind the code
  (ranks log at different times), frames do not.
- A server stopped on purpose after it was serving ([stop]) ends the search: what follows is the stop's
  echo.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from dataclasses import dataclass, field

from kernel.analyzer.lines import LineParser, LogLine
from kernel.analyzer.rules import Context, ErrorRule, Marker, Rules, default_rules, gate
from kernel.analyzer.signature import signature
from protos.vocab import PHASES, UNKNOWN_PHASE

_PHASE_ORDER = {phase: i for i, phase in enumerate(PHASES)}
# watch(): first error still open; markers and other patterns whose lines count anywhere; later OOMs
# count; wrappers count (--explain lists the first few)
_WatchKey = tuple[bool, tuple[Marker, ...], tuple[re.Pattern[str], ...], bool, bool]
_IDLE, _FRAMES, _MESSAGE = 0, 1, 2
_RULE, _GENERIC, _WEAK, _WRAPPER = 1, 2, 3, 4
CONTEXT_BEFORE = 3  # lines of the same stream kept before an error
_CONTEXT_AFTER = 3  # message lines kept after it while it is still uncertain
_MAX_STREAMS = 512  # streams are keyed by pid; old ones are forgotten past this many
_MAX_WEAK = 16
_MAX_DEMOTED = 8
_DEMOTED_WINDOW = 4096  # lines after the first error in which wrappers are still listed (they follow it closely)
_MAX_LATE = 8  # wrappers kept as evidence of where the run was, after an error nothing else places
# What a wrapper or marker right after the error overrides: the error waits for one (phase_from of _placed).
_UNPLACED = frozenset({"unknown", "default", "rule_in_startup", "rule_usual"})


@dataclass(frozen=True)
class PhaseFinding:
    """The log proved a new phase (emitted on the marker line itself)."""

    phase: str
    line: str
    line_no: int


@dataclass(frozen=True)
class ErrorFinding:
    """The first error, emitted once, as soon as it is certain."""

    phase: str
    category: str
    line: str
    line_no: int
    context: tuple[str, ...]
    secondary_oom: bool
    signature: str
    hint: str
    during: str = ""  # the log stretch it happened in (rules.toml [[context]], e.g. "cudagraph_capture")
    why: tuple[str, ...] = ()  # what chose this line, phase and category (`k3repro analyze --explain`)
    # What placed the phase: "marker" (the log's phase lines), "frames", "module" (the logger's call site),
    # "method" (a worker RPC its line names), "request_id", "collective_seq", "rule" (only one phase is possible),
    # "wrapper_after"/"marker_after" (a line right after it says where the run was), "rule_in_startup" (where the
    # rule's error happens, the engine starting), "rule_usual" (a compile-class rule's phase), "default"
    # (rules.toml's disclosed guess), "unknown" (phase "unknown": nothing places it; the analyzer does not guess).
    phase_from: str = ""
    # False when the log does not show the exception itself (a traceback cut before its exception line): the
    # line is the traceback's header or last frame, and the category comes from what the frames show.
    confident: bool = True


@dataclass(frozen=True)
class Stall:
    """No progress for idle_s seconds; phase is where the run was (None: before any marker)."""

    phase: str | None
    idle_s: float
    last_line: str


@dataclass(frozen=True)
class Watch:
    """What a line must contain to change the result (StreamAnalyzer.watch): a literal of `any_line`,
    or, in a line logged at an error level or not logged, a literal of `error_line`. None at all: the
    result is final."""

    any_line: frozenset[str]
    error_line: frozenset[str]

    @property
    def final(self) -> bool:
        return not (self.any_line or self.error_line)


@dataclass(frozen=True, slots=True)
class _Late:
    """A line that says where the run was (a wrapper's phase or method, a marker) or that it was starting."""

    line_no: int
    phase: str | None
    what: str
    startup: bool = False
    context: Context | None = None  # a context the marker's line started (the capture's progress bar)


@dataclass(slots=True)
class _Candidate:
    line_no: int
    display: str
    msg: str
    tier: int
    rule: ErrorRule | None
    run_phase: str | None
    context: Context | None
    before: tuple[str, ...]
    key: tuple[str, str]
    opened_at: int  # global line count when it was created
    src: str = ""  # the logger's call site
    frame_phase: str | None = None
    frame_line: str = ""  # the frame that placed it
    frame_context: Context | None = None  # a context its traceback's frames put it in
    groups: dict[str, str] = field(default_factory=dict)
    refined: ErrorRule | None = None  # a rule matched by a continuation line of a generic exception
    cause: str = ""  # the continuation line that names the cause (the rule's cause_follows)
    after: list[str] = field(default_factory=list)
    reserved: bool = False  # a header waiting for its traceback to end
    cut: bool = False  # a traceback that ends (the log ends) before its exception line
    startup: bool = False  # its traceback shows the engine starting ([defaults] startup_frames)


@dataclass(slots=True)
class _Stream:
    state: int = _IDLE
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=CONTEXT_BEFORE))
    frame_phase: str | None = None
    frame_line: str = ""
    frame_context: Context | None = None
    suppress: bool = False  # the next traceback belongs to a benign header
    header: _Candidate | None = None  # a logged ERROR line: heads a traceback if the next line starts one
    reservation: _Candidate | None = None  # a header whose traceback is running
    pending: _Candidate | None = None  # a generic exception whose message may continue
    unplaced: _Candidate | None = None  # an exception no frame placed, waiting for a chained traceback
    message_lines: int = 0
    last_frame: LogLine | None = None  # the traceback's last `File "…"` line (names a cut traceback's failure)
    last_frame_no: int = 0
    last_frame_run_phase: str | None = None
    startup: bool = False  # the running traceback has a frame of the engine starting
    after_frame: bool = False  # the stream's last line was a `File "…"` frame line (its source line is next)
    loose_code: str = ""  # a logged source line outside a traceback (an excerpt that starts inside one)
    wrapper_head: _Candidate | None = None  # a logged wrapper line: heads a traceback if the next line starts one
    cut_head: _Candidate | None = None  # the wrapper line heading the running traceback


class StreamAnalyzer:
    """Feed lines as they arrive; read `phase`, `first_error`, `healthy`; ask `stalled()` for hangs."""

    def __init__(self, rules: Rules | None = None, *, started_at: float | None = None) -> None:
        self.rules = rules or default_rules()
        self._parser = LineParser(self.rules.line)
        self._tb = self.rules.traceback
        self._error_levels = self.rules.line.error_levels
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._last_key_of_proc: dict[str, tuple[str, str]] = {}
        self._n = 0
        self._marker_phase: str | None = None
        self._evidence_phase: str | None = None
        self._ready = False
        self._phases_seen: list[str] = []
        self._contexts: dict[str, Context] = {}
        self._open: list[_Candidate] = []  # uncertain strong candidates and held header places
        self._best: _Candidate | None = None  # earliest certain strong candidate
        self._weak: list[_Candidate] = []
        self._wrapper: _Candidate | None = None
        self._last_oom_line = 0
        self._first_error: ErrorFinding | None = None
        self._emitted: _Candidate | None = None
        self._closed = False
        self._last_progress_at = time.monotonic() if started_at is None else started_at
        self._last_line = ""
        self.last_level: str | None = None  # the log level of the line fed last (None: no log header)
        self.last_progress_line = ""  # the last line that was not one of vLLM's waiting messages
        self._saw_idle = False
        self._rule_gate = self.rules.rule_gate
        self._rule_list = self.rules.rules
        self._later_oom = False  # after the first error: whether a later OOM makes it secondary
        self._stopped_at = 0  # line of the stop notice that ended a serving run (0: none)
        self._stop_line = ""
        self._echoes = 0  # error lines after the stop notice
        self._demoted: list[tuple[int, str]] = []  # wrappers passed over, for --explain
        # Lines after which an earlier error nothing else places is placed: wrappers and markers (_Late).
        self._late: deque[_Late] = deque(maxlen=_MAX_LATE)
        self._marker_at: tuple[int, str] | None = None  # the marker line that moved the phase last
        self._module_phases: dict[str, str | None] = {}
        self._frame_contexts = tuple(c for c in self.rules.contexts if c.frames is not None)
        self._active_markers: tuple[Marker, ...] = ()
        self._quiet_gate = self._refresh_quiet()
        self._watch_cache: dict[_WatchKey, Watch] = {}
        self._touched: dict[tuple[str, str], _Stream] = {}  # streams that may be busy (see watch())

    # -- public state ---------------------------------------------------------------------------

    @property
    def phase(self) -> str | None:
        """The phase the markers have reached (None before the first marker)."""
        return self._marker_phase

    @property
    def phases_seen(self) -> tuple[str, ...]:
        return tuple(self._phases_seen)

    @property
    def first_error(self) -> ErrorFinding | None:
        return self._first_error

    @property
    def healthy(self) -> bool:
        """Ready (`Application startup complete.` or an offline engine's readiness) and no error so far."""
        return self._ready and self._first_error is None and self._best is None and not self._open

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def secondary_oom(self) -> bool:
        """Whether the first error's OOM is secondary, with everything seen so far (it can turn true
        after the ErrorFinding was emitted, when an OOM follows a different first error)."""
        if self._emitted is None or self._first_error is None:
            return False
        return self._secondary(self._emitted, self._first_error.category)

    @property
    def lines(self) -> int:
        return self._n

    @property
    def stopped(self) -> bool:
        """A serving run was stopped on purpose ([stop]): later errors are its echo."""
        return bool(self._stopped_at)

    def explain(self) -> tuple[str, ...]:
        """Why the result is what it is beyond the finding's own reasons (ErrorFinding.why): the stop
        that ended the search, the wrappers passed over."""
        out = []
        if self._stopped_at:
            out.append(
                f"stop: line {self._stopped_at} stopped a serving server on purpose ({self._stop_line}); "
                f"{self._echoes} error line(s) after it are the stop's echo, not failures"
            )
        reported = self._first_error.line_no if self._first_error else 0
        out += [text for line_no, text in self._demoted if line_no != reported]
        return tuple(out)

    def watch(self) -> Watch | None:
        """For whole-file analysis, which jumps over lines: None while every line must be read (a
        traceback, message or header is open, or the rules have no needles); else the literals a line
        must contain to change the result from here on."""
        if self.rules.scan is None or self._open:
            return None
        key: _WatchKey
        if self._first_error is None:
            ok = _idle
            # What _quiet looks for: the markers that can still change something (an excerpt without
            # readiness repeats a seen phase's marker on every access line), the contexts' next edges
            # and, while serving, a stop notice (a line a serving log repeats then costs one read, not
            # one per repetition).
            edges = tuple(c.end if c.name in self._contexts else c.start for c in self.rules.contexts)
            if self._stop_armed():
                assert self.rules.stop is not None
                edges += (self.rules.stop,)
            key = (True, self._active_markers, edges, False, False)
        else:
            # Only a later OOM (secondary_oom), one of the first few wrappers (--explain lists them; neither
            # in a suppressed traceback) and markers of phases not seen yet can still count. While a phase is unseen
            # every marker that can move the phase matters: on a line with several markers the first
            # active one wins.
            emitted = self._emitted
            oom = self._later_oom and emitted is not None and emitted.tier <= _GENERIC and not self.secondary_oom
            markers = self._active_markers if any(m.phase not in self._phases_seen for m in self.rules.markers) else ()

            wrappers = self._listing_wrappers()

            def ok(st: _Stream) -> bool:
                return not ((oom or wrappers) and st.suppress)

            key = (False, markers, (), oom, wrappers)
        for stream_key, st in list(self._touched.items()):
            if self._streams.get(stream_key) is st and not ok(st):
                return None
            del self._touched[stream_key]
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
        self._n += count

    @property
    def holds_logged_error(self) -> bool:
        """For whole-file analysis: nothing failed, is open or stopped the search, and a logged error line is held
        (the first error unless a stronger one comes). A later line at an error level then changes the result only
        as the header of a traceback that follows it, or by the frames it names (kernel.analyzer.scan)."""
        return self._first_error is None and not self._open and not self._stopped_at and bool(self._weak)

    def stalled(self, now: float, threshold_s: float) -> Stall | None:
        """A hang: no progress line for threshold_s (lines vLLM repeats while waiting do not count).

        None once the run is ready or failed: then there is nothing left to wait for in the log.
        """
        if self._ready or self._first_error is not None:
            return None
        idle = now - self._last_progress_at
        if idle < threshold_s:
            return None
        return Stall(self._marker_phase, idle, self._last_line)

    def hang_finding(self, stall: Stall) -> ErrorFinding:
        """A hang as the launch's first error: where it stopped, and what its last line says it waited for."""
        phase = stall.phase or "container_init"
        rule = next((h for h in self.rules.hangs if h.pattern.search(stall.last_line)), None)
        category = rule.category if rule else self.rules.category_by_phase.get(phase, self.rules.default_category)
        return ErrorFinding(
            phase=phase,
            category=category,
            line=f"hang: no progress in {phase} for {stall.idle_s:.0f} s; last line: {stall.last_line or '(none)'}",
            line_no=self._n,
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
        self._n += 1
        out: list[PhaseFinding | ErrorFinding] = []
        ll = self._parser.parse(line)
        self._saw_idle = False
        self._line(ll, out)
        if not self._saw_idle:
            self._last_progress_at = time.monotonic() if at is None else at
            self.last_progress_line = ll.display
        self._last_line = ll.display
        self.last_level = ll.level
        if self._open:
            self._expire()
        if self._first_error is None and self._best is not None:
            self._maybe_emit(out)
        return out

    def settle(self) -> list[PhaseFinding | ErrorFinding]:
        """The log went quiet with something still uncertain (a traceback or a message no later line ended):
        settle it as if the lines that end it had passed, and report the first error that makes. A serving
        engine writes nothing after a failed request's traceback until its next stats line, so the line count
        that settles a candidate in a busy log may never come. Lines fed later are read as before."""
        out: list[PhaseFinding | ErrorFinding] = []
        if self._closed or self._first_error is not None or not self._open:
            return out
        self._expire(force=True)
        if self._first_error is None and self._best is not None:
            self._maybe_emit(out, force=True)
        return out

    def close(self) -> list[PhaseFinding | ErrorFinding]:
        """End of the log: settle what was still uncertain and report the first error if not yet done."""
        if self._closed:
            return []
        self._closed = True
        out: list[PhaseFinding | ErrorFinding] = []
        for cand in self._open:
            if cand.reserved:
                cand.reserved = False
                cand.tier = _GENERIC
            self._settle(cand)
        self._open.clear()
        for stream in self._streams.values():
            if stream.header is not None:
                self._add_weak(stream.header)
                stream.header = None
            if self._first_error is None and not self._stopped_at:
                self._cut_traceback(stream)
        if self._first_error is None:
            if self._best is None and self._weak:
                self._best = min(self._weak, key=lambda c: c.line_no)
            if self._best is None and self._wrapper is not None:
                self._best = self._wrapper
            self._maybe_emit(out, force=True)
        return out

    def _cut_traceback(self, st: _Stream) -> None:
        """The log ended inside a traceback, before its exception line (an excerpt cut short): the failure is
        still there, named by the traceback's logged header or else its last frame, with less confidence."""
        if st.state != _FRAMES or st.last_frame is None or st.suppress:
            return
        cand = st.reservation or st.cut_head
        if cand is st.cut_head and cand is not None:
            self._add_weak(cand)
        wrapper = self._wrapper
        if cand is None and wrapper is not None and wrapper.key[0] == st.last_frame.proc:
            return  # the process's own exit re-raising the exception its wrapper line already reported
        if cand is None:
            ll = st.last_frame
            cand = _Candidate(
                line_no=st.last_frame_no,
                display=ll.display,
                msg=ll.msg,
                tier=_WEAK,
                rule=None,
                run_phase=st.last_frame_run_phase,
                context=None,
                before=(),
                key=(ll.proc, ll.src),
                opened_at=self._n,
                src=ll.src,
            )
            self._add_weak(cand)
        cand.cut = True
        cand.frame_phase, cand.frame_line = st.frame_phase, st.frame_line
        cand.frame_context, cand.startup = st.frame_context, st.startup

    # -- one line -------------------------------------------------------------------------------

    def _line(self, ll: LogLine, out: list[PhaseFinding | ErrorFinding]) -> None:
        key = (ll.proc, ll.src)
        st = self._streams.get(key)
        if st is None:
            st = self._new_stream(key)
        self._touched[key] = st  # only its own lines make a stream busy
        other = self._last_key_of_proc.get(ll.proc)
        if other is not None and other != key:
            # One process writes sequentially: a line of its other stream ends this one's message.
            other_stream = self._streams.get(other)
            if other_stream is not None:
                self._end_message(other_stream)
                self._place(other_stream)
                self._resolve_header(other_stream, starts_traceback=False)
        if len(self._last_key_of_proc) > _MAX_STREAMS:
            self._last_key_of_proc.clear()  # pids churn in long logs; this only speeds up message ends
        self._last_key_of_proc[ll.proc] = key
        msg = ll.msg
        tb = self._tb
        after_frame, st.after_frame = st.after_frame, False
        loose, st.loose_code = st.loose_code, ""
        head, st.wrapper_head = st.wrapper_head, None
        if ll.level is not None and ll.level not in self._error_levels:
            self._resolve_header(st, starts_traceback=False)
            self._end_message(st)
            self._place(st)
            _clear_frames(st)
            self._quiet(ll, out)
            st.recent.append(ll.display)
            return
        if self._stop_armed() and self._is_stop(msg) and not self.rules.line.code.match(msg):
            self._stop(ll)
        if st.header is not None:
            # (a header may end with the traceback's first line: `EngineCore hit an exception: Traceback (…):`)
            starts = tb.start.match(msg) is not None or (
                tb.frame.match(msg) is not None and tb.start.search(st.header.msg) is not None
            )
            self._resolve_header(st, starts_traceback=starts)
        if tb.start.match(msg):
            self._end_message(st)
            st.state = _FRAMES
            _clear_frames(st)
            st.cut_head = head
        elif st.state == _FRAMES and not msg.strip():
            pass  # a blank logged line inside a traceback's frames (a collector's or a logger's): not its end
        elif tb.chain.match(msg) or not msg.strip():
            # An exception's message ends; one no frame placed waits for the traceback chained to it.
            self._end_message(st)
            st.state = _IDLE
            st.suppress = False
        elif self.rules.line.code.match(msg):
            # Source lines: a traceback's frames. Outside one only a frame line opens it (an excerpt
            # that starts inside a traceback); other indented text is no error.
            if st.state == _MESSAGE:
                self._continue_message(st, ll, match_rules=False)
            elif st.state == _FRAMES or tb.frame.match(msg):
                if st.state != _FRAMES and loose:
                    self._frame(st, loose)  # the excerpt began with an outer frame's source line
                st.state = _FRAMES
                self._frame(st, msg)
                if tb.frame.match(msg):
                    st.last_frame, st.last_frame_no, st.last_frame_run_phase = ll, self._n, self._run_phase()
                    st.after_frame = True
            elif ll.level is not None:
                # (Only a logged one: whole-file reading may jump over an unlogged line without needles.)
                st.loose_code = msg if msg.strip(" ^~") else loose  # (a `^^^` marker line keeps the code above it)
        elif st.state == _FRAMES and after_frame and not tb.exception.match(msg):
            self._frame(st, msg)  # a frame's source line that a collector unindented
        elif st.state == _FRAMES and tb.exception.match(msg):
            self._place(st)
            self._exception(st, ll)
            # Markers count in every line but traceback source and structure, whatever the stream's
            # state: so whole-file analysis need not follow tracebacks once the first error is known.
            self._quiet(ll, out)
        else:
            if st.state == _MESSAGE:
                self._continue_message(st, ll, match_rules=True)
            else:
                st.state = _IDLE  # anything else ends a run of frames that had no exception line
                self._place(st)
                self._idle_line(st, ll)
            self._quiet(ll, out)
        st.recent.append(ll.display)

    def _new_stream(self, key: tuple[str, str]) -> _Stream:
        if len(self._streams) >= _MAX_STREAMS:
            # The oldest idle streams go first: how many idle ones a log had must not change its result
            # (whole-file analysis never sees the streams of lines it jumps over).
            by_age = sorted(self._streams, key=lambda k: not _idle(self._streams[k]))
            for old in by_age[: _MAX_STREAMS // 4]:
                stream = self._streams.pop(old)
                self._touched.pop(old, None)
                if stream.header is not None:
                    self._add_weak(stream.header)
        st = _Stream()
        self._streams[key] = st
        return st

    def _frame(self, st: _Stream, msg: str) -> None:
        """A traceback line: the outermost frame that places the error, the first context frame."""
        rules = self.rules
        if st.frame_phase is None and rules.frame_gate.search(msg):
            hint = next(h for h in rules.frame_hints if h.pattern.search(msg))
            st.frame_phase, st.frame_line = hint.phase, msg.strip()
        if st.frame_context is None and self._frame_contexts and rules.context_frame_gate.search(msg):
            st.frame_context = next(c for c in self._frame_contexts if c.frames and c.frames.search(msg))
        if not st.startup and rules.startup_frames is not None and rules.startup_frames.search(msg):
            st.startup = True
            if st.unplaced is not None:
                st.unplaced.startup = True  # a chained traceback of the engine starting encloses it
        cand = st.unplaced
        if cand is not None and st.frame_phase is not None:
            # The traceback chained to an unplaced exception encloses it: its frames place it.
            cand.frame_phase, cand.frame_line = st.frame_phase, f"{st.frame_line} (chained traceback)"
            cand.frame_context = cand.frame_context or st.frame_context
            self._place(st)

    def _module_phase(self, src: str) -> str | None:
        """The phase the logger's call site runs in ([[module_hint]]); cached, call sites repeat."""
        if src not in self._module_phases:
            if len(self._module_phases) > _MAX_STREAMS:
                self._module_phases.clear()
            hint = next((h for h in self.rules.module_hints if h.pattern.search(src)), None)
            self._module_phases[src] = hint.phase if hint else None
        return self._module_phases[src]

    def _frame_hint(self, text: str) -> str | None:
        """The phase a frame hint gives `text` (a frame line, or a worker method a wrapper names)."""
        if not self.rules.frame_gate.search(text):
            return None
        return next(h.phase for h in self.rules.frame_hints if h.pattern.search(text))

    def _late_window(self, cand: _Candidate) -> list[_Late]:
        """The evidence lines within `max_wait_lines` after the candidate."""
        end = cand.line_no + self._tb.max_wait_lines
        return [x for x in self._late if cand.line_no < x.line_no <= end]

    def _late_after(self, cand: _Candidate) -> _Late | None:
        """The first line right after the candidate that says where the run was."""
        return next((x for x in self._late_window(cand) if x.phase is not None), None)

    def _match(self, msg: str) -> ErrorRule | None:
        if not self._rule_gate.search(msg):
            return None
        for rule in self._rule_list:
            if rule.pattern.search(msg):
                return rule
        return None

    def _idle_line(self, st: _Stream, ll: LogLine) -> None:
        """A line outside any traceback, at an error level or unlogged."""
        msg = ll.msg
        rule = self._match(msg)
        if self._first_error is not None:
            self._after_first(rule, ll)
            return
        if self._stopped_at:
            self._echoes += rule is not None or ll.level is not None or bool(self._tb.standalone.match(msg))
            return
        if rule is not None:
            if rule.kind == "wrapper":
                self._wrapped(rule, st, ll)
            elif rule.kind == "benign":
                st.suppress = rule.suppress_traceback
            elif rule.kind == "weak":
                self._add_weak(self._candidate(st, ll, _WEAK, rule))
                if rule.phase_fixed and _later(rule.phase, self._evidence_phase):
                    self._evidence_phase = rule.phase  # like a marker: the run was there
            else:
                cand = self._candidate(st, ll, _RULE, rule)
                if self._tb.standalone.match(msg):
                    st.state, st.message_lines = _MESSAGE, 0
                if st.state == _MESSAGE and (
                    rule.cause_follows is not None or (cand.run_phase is None and self._unplaced(cand))
                ):
                    # (A log without markers: a traceback chained to it may still place it, as for an
                    # exception that ends a traceback.)
                    st.pending = cand
                    self._open.append(cand)
                else:
                    self._settle(cand)
            return
        if self._tb.standalone.match(msg):
            cand = self._candidate(st, ll, _GENERIC, None)
            st.pending, st.state, st.message_lines = cand, _MESSAGE, 0
            self._open.append(cand)
        elif ll.level is not None and self._first_error is None:
            # A logged error record's other lines are traceback content (collectors may strip the
            # indentation), so they can place the error too.
            self._frame(st, msg)
            st.header = self._candidate(st, ll, _WEAK, None)

    def _exception(self, st: _Stream, ll: LogLine) -> None:
        """The line that ends a traceback."""
        st.state, st.message_lines = _MESSAGE, 0
        reservation, st.reservation = st.reservation, None
        if reservation is not None:
            self._open.remove(reservation)
        if st.suppress:
            st.suppress = False
            return
        msg = ll.msg
        rule = self._match(msg)
        if self._first_error is not None:
            self._after_first(rule, ll)
            return
        if self._stopped_at and reservation is None:
            self._echoes += 1
            _clear_frames(st)
            return
        if rule is not None and rule.kind not in ("root", "weak"):
            if rule.kind == "wrapper":
                self._wrapped(rule, st, ll)
            return
        if rule is not None and rule.kind == "weak":
            rule = None  # an exception line is stronger evidence than a library's warning it happens to quote
        tier = _RULE if rule is not None else _GENERIC
        told = msg.partition(": ")[2].strip()
        if reservation is not None and len(told) >= 8 and told in reservation.msg:
            cand = reservation
            cand.reserved, cand.tier, cand.rule = False, tier, rule
            cand.groups = _groups(rule, msg)
        else:
            if reservation is not None:
                self._add_weak(reservation)
            cand = self._candidate(st, ll, tier, rule)
        _take_frames(st, cand)
        if tier == _RULE and not self._unplaced(cand) and (rule is None or rule.cause_follows is None):
            self._settle(cand)
        else:
            st.pending = cand
            self._open.append(cand)

    def _after_first(self, rule: ErrorRule | None, ll: LogLine) -> None:
        """Once the first error is out, a line matters only as a later OOM or as a wrapper to list (the
        rule list holds only those rules then)."""
        if rule is None:
            return
        if rule.kind == "wrapper":
            self._demote(rule, ll)
        if rule.category == "oom" and self._later_oom:
            self._last_oom_line = self._n

    def _listing_wrappers(self) -> bool:
        """Whether a wrapper is still listed: the first few, close after the first error (if any)."""
        error = self._first_error
        return len(self._demoted) < _MAX_DEMOTED and (error is None or self._n - error.line_no <= _DEMOTED_WINDOW)

    def _demote(self, rule: ErrorRule, ll: LogLine) -> None:
        if self._listing_wrappers():
            self._demoted.append((self._n, f"wrapper passed over: line {self._n} ({rule.id}): {ll.display}"))

    def _continue_message(self, st: _Stream, ll: LogLine, *, match_rules: bool) -> None:
        """A line that may continue the exception message above it (refines a generic one's category)."""
        st.message_lines += 1
        cand = st.pending
        if cand is not None and len(cand.after) < _CONTEXT_AFTER:
            cand.after.append(ll.display)
        follows = cand.rule.cause_follows if cand is not None and cand.rule is not None else None
        if cand is not None and follows is not None and follows.search(ll.msg):
            cand.cause = ll.msg.strip()
            self._end_message(st)
            return
        if match_rules:
            rule = self._match(ll.msg)
            if rule is not None and self._first_error is not None:
                self._after_first(rule, ll)  # whatever the stream's state, as whole-file analysis sees it
            elif rule is not None and rule.kind == "root":
                if cand is not None and cand.rule is None and cand.refined is None:
                    cand.refined = rule
                    cand.groups = _groups(rule, ll.msg)
                elif rule.category == "oom":
                    self._last_oom_line = self._n
        if st.message_lines >= self._tb.max_message_lines:
            self._end_message(st)

    def _end_message(self, st: _Stream) -> None:
        if st.state == _MESSAGE:
            st.state = _IDLE
        cand, st.pending = st.pending, None
        if cand is None:
            return
        if self._unplaced(cand):
            self._place(st)
            st.unplaced = cand  # stays open: a chained traceback's frames may place it (see _frame)
        else:
            self._open.remove(cand)
            self._settle(cand)

    def _unplaced(self, cand: _Candidate) -> bool:
        """No frame places the error and its phase is not already certain."""
        rule = cand.rule
        return cand.frame_phase is None and cand.run_phase != "request" and not (rule is not None and rule.phase_fixed)

    def _place(self, st: _Stream) -> None:
        """The unplaced exception of this stream is as placed as it gets: it becomes certain."""
        cand, st.unplaced = st.unplaced, None
        if cand is not None:
            self._open.remove(cand)
            self._settle(cand)

    def _resolve_header(self, st: _Stream, *, starts_traceback: bool) -> None:
        header, st.header = st.header, None
        if header is None:
            return
        if starts_traceback and not st.suppress:
            header.reserved = True
            st.reservation = header
            self._open.append(header)
        else:
            self._add_weak(header)

    def _add_weak(self, cand: _Candidate) -> None:
        cand.tier = _WEAK
        if len(self._weak) < _MAX_WEAK:
            self._weak.append(cand)

    def _wrapped(self, rule: ErrorRule, st: _Stream, ll: LogLine) -> None:
        if rule.phase is not None and _later(rule.phase, self._evidence_phase):
            self._evidence_phase = rule.phase
        method = _groups(rule, ll.msg).get("method")
        phase = rule.phase or (self._frame_hint(f"in {method}") if method else None)
        if phase is not None or rule.startup:
            self._late.append(
                _Late(self._n, phase, f"{rule.id}" + (f", method {method}" if method else ""), rule.startup)
            )
        if ll.level is not None:
            st.wrapper_head = self._candidate(st, ll, _WEAK, None)
        self._demote(rule, ll)
        if self._wrapper is None:
            cand = self._wrapper = self._candidate(st, ll, _WRAPPER, rule)
            cause = cand.groups.get("cause")
            if cause is not None:
                cand.refined = next((r for r in self.rules.rules if r.kind == "root" and r.pattern.search(cause)), None)
                cand.groups = {**_groups(cand.refined, cause), **cand.groups}
        _clear_frames(st)

    def _candidate(self, st: _Stream, ll: LogLine, tier: int, rule: ErrorRule | None) -> _Candidate:
        context = next(reversed(self._contexts.values()), None) if self._contexts else None
        return _Candidate(
            line_no=self._n,
            display=ll.display,
            msg=ll.msg,
            tier=tier,
            rule=rule,
            run_phase=self._run_phase(),
            context=context,
            before=tuple(st.recent),
            key=(ll.proc, ll.src),
            opened_at=self._n,
            src=ll.src,
            frame_phase=st.frame_phase,
            frame_line=st.frame_line,
            frame_context=st.frame_context,
            groups=_groups(rule, ll.msg),
            startup=st.startup,
        )

    def _settle(self, cand: _Candidate) -> None:
        """A strong candidate became certain: keep it if it is the earliest."""
        category = self._category(cand) if cand.tier <= _GENERIC else None
        if category == "oom":
            self._last_oom_line = max(self._last_oom_line, cand.line_no)
        if self._first_error is not None:
            return
        if self._best is None or cand.line_no < self._best.line_no:
            self._best = cand

    def _expire(self, force: bool = False) -> None:
        """Settles the open candidates that waited long enough (every one when `force`)."""
        tb = self._tb
        for cand in list(self._open):
            waited = math.inf if force else self._n - cand.opened_at
            if cand.reserved and waited > tb.header_wait_lines:
                self._open.remove(cand)
                stream = self._streams.get(cand.key)
                if stream is not None and stream.reservation is cand:
                    stream.reservation = None
                self._add_weak(cand)
            elif not cand.reserved and waited > tb.max_wait_lines:
                stream = self._streams.get(cand.key)
                if stream is not None and cand in (stream.pending, stream.unplaced):
                    if stream.pending is cand:
                        self._end_message(stream)
                    self._place(stream)
                else:
                    self._open.remove(cand)
                    self._settle(cand)

    def _maybe_emit(self, out: list[PhaseFinding | ErrorFinding], force: bool = False) -> None:
        best = self._best
        if best is None or any(c.line_no < best.line_no for c in self._open):
            return
        phase, phase_why, phase_from = self._placed(best)
        if (
            phase_from in _UNPLACED
            and not (force or self._closed)
            and self._n - best.line_no <= self._tb.max_wait_lines
        ):
            return  # a wrapper may still say where the run was (EngineDeadError right after a serving failure)
        category, category_why = self._categorized(best)
        hint = self._hint(best, category)
        secondary = self._secondary(best, category)
        if secondary:
            hint = (
                f"{hint} {self.rules.secondary_oom_hint}".strip()
                if category != "oom"
                else (self.rules.secondary_oom_hint or hint)
            )
        context = best.frame_context or best.context
        during = context.name if context is not None else ""
        if best.tier == _WRAPPER and best.rule is not None and best.rule.hang:
            during = "hang"
        finding = ErrorFinding(
            phase=phase,
            category=category,
            line=best.display,
            line_no=best.line_no,
            context=(*best.before, best.display, *best.after),
            secondary_oom=secondary,
            signature=signature(self.rules, phase, category, f"{best.msg} {best.cause}".rstrip()),
            hint=hint,
            during=during,
            why=(
                f"line: {self._chosen(best)}",
                f"phase: {phase} (from {phase_from}): {phase_why}",
                f"category: {category}: {category_why}",
                *(
                    ["confidence: low: the log ends inside this traceback, before its exception line"]
                    if best.cut
                    else []
                ),
            ),
            phase_from=phase_from,
            confident=not best.cut,
        )
        self._first_error = finding
        self._emitted = best
        self._open.clear()
        self._weak.clear()
        for stream in self._streams.values():
            stream.header = stream.reservation = stream.pending = stream.unplaced = None
        # From now on only a later OOM matters (it makes this one's OOM secondary), and wrappers to list.
        self._later_oom = category != "oom"
        self._rule_list = tuple(
            r for r in self.rules.rules if r.kind == "wrapper" or (self._later_oom and r.category == "oom")
        )
        self._rule_gate = gate(r.pattern for r in self._rule_list)
        out.append(finding)

    # -- deciding phase, category, hint --------------------------------------------------------

    def _run_phase(self) -> str | None:
        if self._ready:
            return "request"
        phase = self._marker_phase
        if _later(self._evidence_phase, phase):
            phase = self._evidence_phase
        return phase

    def _chosen(self, cand: _Candidate) -> str:
        """Why this line is the first error."""
        rule = cand.rule
        if cand.tier == _WRAPPER and rule is not None and rule.hang:
            return f"the launch was interrupted ({rule.id}) before it was ready: the finding is the hang before it"
        if cand.tier == _WRAPPER and rule is not None:
            cause = f", quoting {cand.refined.id}" if cand.refined is not None else ""
            return f"only a wrapper ({rule.id}{cause}) is in the log: the error it wraps is not"
        if rule is not None:
            return f"the earliest error a root rule names ({rule.id})"
        if cand.cut:
            named = (
                "its logged header"
                if cand.line_no < cand.opened_at and cand.rule is None and cand.src
                else "its last frame"
            )
            return f"a traceback the log cuts before its exception line, named by {named}"
        if cand.tier == _WEAK:
            return "a logged ERROR line: the log has no exception or rule-named error"
        refined = f" (its message matches {cand.refined.id})" if cand.refined is not None else ""
        return f"the earliest exception, which no rule names{refined}"

    def _phase_of(self, cand: _Candidate) -> str:
        return self._placed(cand)[0]

    def _placed(self, cand: _Candidate) -> tuple[str, str, str]:
        """The error's phase, what placed it, and the kind of evidence (ErrorFinding.phase_from)."""
        rules = (cand.refined, cand.rule) if cand.tier == _WRAPPER else (cand.rule, cand.refined)
        for rule in rules:
            if rule is not None and rule.phase_fixed and rule.phase is not None:
                return rule.phase, f"{rule.id} happens only there", "rule"
        if cand.run_phase == "request":
            return "request", "the server was serving (a readiness marker came before)", "marker"
        if cand.frame_phase is not None:
            return cand.frame_phase, f"traceback frame {cand.frame_line}", "frames"
        module = self._module_phase(cand.src) if cand.src else None
        if module is not None:
            return module, f"logged by {cand.src}", "module"
        named = self.rules.method_named.search(cand.msg) if self.rules.method_named is not None else None
        method_phase = self._frame_hint(f"in {named['method']}") if named is not None else None
        if named is not None and method_phase is not None:
            return method_phase, f"the worker method its line names ({named['method']})", "method"
        seq = cand.groups.get("seq") or cand.groups.get("seq2")
        if seq is not None and seq.isdigit():
            # A collective's sequence number counts the collectives the group had done: start-up runs a few.
            done = int(seq)
            if done >= self.rules.serving_seq:
                return "request", f"collective number {done}: the engine had been running collectives", "collective_seq"
            if done <= 1:
                return "gpu_detect", f"collective number {done}: the group's first collective", "collective_seq"
        request = self.rules.request_evidence
        if request is not None and any(request.search(text) for text in (cand.msg, *cand.after)):
            return "request", "the error names a request (its id)", "request_id"
        if cand.run_phase is not None:
            return cand.run_phase, "the phase the log's markers had reached", "marker"
        late = self._late_after(cand)
        if late is not None and late.phase is not None:
            kind = "marker" if late.what == "marker" else "wrapper"
            return (
                late.phase,
                f"the {kind} right after it (line {late.line_no}, {late.what}) says where the run was",
                f"{kind}_after",
            )
        startup = cand.startup or any(x.startup for x in self._late_window(cand))
        for rule in rules:
            if startup and rule is not None and rule.phase is not None:
                why = f"where {rule.id} happens in a start-up (its traceback shows the engine starting)"
                return rule.phase, why, "rule_in_startup"
            if rule is not None and rule.phase_usual and rule.phase is not None:
                return rule.phase, f"where {rule.id} happens (its class: rules.toml phase_usual)", "rule_usual"
        if self.rules.default_phase != UNKNOWN_PHASE:
            return self.rules.default_phase, "nothing in the log places it: the default", "default"
        return UNKNOWN_PHASE, "nothing in the log places it: no phase is guessed", "unknown"

    def _category(self, cand: _Candidate) -> str:
        return self._categorized(cand)[0]

    def _categorized(self, cand: _Candidate) -> tuple[str, str]:
        """The error's category and what decided it."""
        rules = self.rules
        rule = cand.rule
        if rule is not None and rule.category is not None:
            return rule.category, f"rule {rule.id}"
        if cand.tier == _WRAPPER and rule is not None and rule.hang:
            phase = self._phase_of(cand)
            category = rules.category_by_phase.get(phase, rules.default_category)
            return category, f"a hang in {phase}, categorized like one"
        if cand.tier == _WRAPPER:
            if "cause" not in cand.groups:
                phase = self._phase_of(cand)
                if phase in rules.category_by_phase:
                    # (where the run was: EngineDeadError while serving is a serving failure)
                    return rules.category_by_phase[phase], f"a wrapper that names no cause, in {phase}"
                return rules.default_category, "a wrapper that names no cause"
            rule = cand.refined
            if rule is not None and rule.category is not None:
                return rule.category, f"the cause the wrapper quotes matches rule {rule.id}"
        elif rule is None:
            rule = cand.refined
            if rule is not None and rule.category is not None:
                return rule.category, f"the exception's message matches rule {rule.id}"
        late = self._late_after(cand) if cand.run_phase is None else None
        context = cand.frame_context or cand.context or (late.context if late is not None else None)
        if context is not None and context.category is not None:
            by = "its traceback's frames" if context is cand.frame_context else "the log"
            return context.category, f"it happened during {context.name} (by {by})"
        phase = self._phase_of(cand)
        if rule is not None and phase in rule.category_by_phase:
            return rule.category_by_phase[phase], f"rule {rule.id} in {phase}"
        category = rules.category_by_phase.get(phase, rules.default_category)
        return category, f"no rule names it: the category of an error in {phase}"

    def _secondary(self, cand: _Candidate, category: str) -> bool:
        if category == "oom":
            if any(rule is not None and rule.secondary_oom for rule in (cand.rule, cand.refined)):
                return True
            context = cand.frame_context or cand.context
            return context is not None and context.secondary_oom
        return cand.tier <= _GENERIC and self._last_oom_line > cand.line_no

    def _hint(self, cand: _Candidate, category: str) -> str:
        for rule in (cand.rule, cand.refined):
            if rule is not None and rule.hint is not None:
                try:
                    return rule.hint.format_map(cand.groups)
                except KeyError:
                    pass
        return self.rules.category_hint(category)

    # -- a deliberate stop ----------------------------------------------------------------------

    def _stop_armed(self) -> bool:
        """A stop notice would end the search: the server was serving and nothing failed yet."""
        return self._ready and not self._stopped_at and self._first_error is None and self.rules.stop is not None

    def _is_stop(self, msg: str) -> bool:
        stop = self.rules.stop
        return stop is not None and stop.search(msg) is not None

    def _stop(self, ll: LogLine) -> None:
        self._stopped_at, self._stop_line = self._n, ll.display
        self._refresh_quiet()

    # -- markers and contexts -------------------------------------------------------------------

    def _refresh_quiet(self) -> re.Pattern[str]:
        """The gate for non-error lines: only markers that can still change something (a new phase, the
        first sight of a phase, readiness, a new launch), the contexts' next edges and idle lines."""
        rules = self.rules
        self._active_markers = tuple(
            m
            for m in rules.markers
            if m.reset
            or (m.ready and not self._ready)
            or m.phase not in self._phases_seen
            or _later(m.phase, self._marker_phase)
        )
        patterns = [m.pattern for m in self._active_markers]
        patterns += [c.end if c.name in self._contexts else c.start for c in rules.contexts]
        if rules.idle is not None:
            patterns.append(rules.idle)
        if self._stop_armed():
            assert rules.stop is not None
            patterns.append(rules.stop)
        self._quiet_gate = gate(patterns)
        return self._quiet_gate

    def _quiet(self, ll: LogLine, out: list[PhaseFinding | ErrorFinding]) -> None:
        text = ll.text
        if not self._quiet_gate.search(text):
            return
        rules = self.rules
        if rules.idle is not None and rules.idle.search(text):
            self._saw_idle = True
        if self._stop_armed() and self._is_stop(ll.msg):
            self._stop(ll)
        changed = False
        started: Context | None = None
        for context in rules.contexts:
            if context.name in self._contexts:
                if context.end.search(text):
                    del self._contexts[context.name]
                    changed = True
            elif context.start.search(text):
                self._contexts[context.name] = started = context
                changed = True
        for marker in self._active_markers:
            if marker.pattern.search(text):
                if self._first_error is None:
                    self._late.append(_Late(self._n, marker.phase, "marker", context=started))
                self._marked(marker.phase, marker.reset, marker.ready, ll, out)
                changed = True
                break
        if changed:
            self._refresh_quiet()

    def _marked(
        self, phase: str, reset: bool, ready: bool, ll: LogLine, out: list[PhaseFinding | ErrorFinding]
    ) -> None:
        before = self._marker_phase
        if reset:
            self._marker_phase = phase
            self._evidence_phase = None
            self._ready = False
            self._contexts.clear()
            self._stopped_at, self._stop_line = 0, ""
        elif _later(phase, before):
            self._marker_phase = phase
        if ready:
            self._ready = True
        if phase not in self._phases_seen:
            self._phases_seen.append(phase)
        if self._marker_phase != before:
            out.append(PhaseFinding(phase, ll.display, self._n))


def _idle(st: _Stream) -> bool:
    """Nothing open in the stream: a line without needles cannot change what its next lines mean."""
    return (
        st.state == _IDLE
        and not st.suppress
        and st.frame_phase is None
        and st.frame_context is None
        and st.header is None
        and st.unplaced is None
        and st.reservation is None
        and st.pending is None
    )


def _clear_frames(st: _Stream) -> None:
    st.frame_phase, st.frame_line, st.frame_context = None, "", None
    st.last_frame, st.startup, st.cut_head = None, False, None


def _take_frames(st: _Stream, cand: _Candidate) -> None:
    """The traceback that just ended placed this candidate (or did not): its frames are the candidate's."""
    cand.frame_phase, cand.frame_line, cand.frame_context = st.frame_phase, st.frame_line, st.frame_context
    cand.startup = cand.startup or st.startup
    _clear_frames(st)


def _later(phase: str | None, than: str | None) -> bool:
    if phase is None:
        return False
    return than is None or _PHASE_ORDER[phase] > _PHASE_ORDER[than]


def _groups(rule: ErrorRule | None, msg: str) -> dict[str, str]:
    if rule is None or not rule.pattern.groupindex:
        return {}
    match = rule.pattern.search(msg)
    if match is None:
        return {}
    return {k: v for k, v in match.groupdict().items() if v is not None}
