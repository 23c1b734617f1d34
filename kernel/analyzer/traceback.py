"""The traceback tracker: every output stream (process prefix + logger call site) has its own traceback
state, so interleaved ranks and processes do not mix their frames. It follows the structure (a traceback's
start, frames, exception line, message, chained tracebacks) and hands the lines that may be errors to the
arbiter's intake (arbiter.ErrorLines)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, TypeVar

from kernel.analyzer.candidates import WEAK, Candidate, Cursor, Late
from kernel.analyzer.findings import ErrorFinding, PhaseFinding
from kernel.analyzer.lines import LogLine
from kernel.analyzer.phases import PhaseTracker
from kernel.analyzer.rules import Context, FrameHint, Rules

if TYPE_CHECKING:  # (the arbiter settles what a stream holds, so it imports this module)
    from kernel.analyzer.arbiter import Arbiter, ErrorLines

IDLE, FRAMES, MESSAGE = 0, 1, 2
CONTEXT_BEFORE = 3  # lines of the same stream kept before an error
_CONTEXT_AFTER = 3  # message lines kept after it while it is still uncertain
_MAX_STREAMS = 512  # streams are keyed by pid; old ones are forgotten past this many
# A terminal's hard wrap (a paste copied from a terminal as it showed the log): a line at least this wide, cut at
# the width of the widest of the last few lines, continues on the next line, which has no prefix of its own.
_WRAP_MIN_WIDTH = 72
_WRAP_RECENT = 8


@dataclass(slots=True)
class Stream:
    """One output stream's traceback state and the candidates it holds open."""

    state: int = IDLE
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=CONTEXT_BEFORE))
    frame_phase: str | None = None
    frame_line: str = ""
    frame_context: Context | None = None
    suppress: bool = False  # the next traceback belongs to a benign header
    header: Candidate | None = None  # a logged ERROR line: heads a traceback if the next line starts one
    reservation: Candidate | None = None  # a header whose traceback is running
    pending: Candidate | None = None  # a generic exception whose message may continue
    unplaced: Candidate | None = None  # an exception no frame placed, waiting for a chained traceback
    message_lines: int = 0
    last_frame: LogLine | None = None  # the traceback's last `File "…"` line (names a cut traceback's failure)
    last_frame_no: int = 0
    frames_from: int = 0  # the line the running traceback began on (its first frame, where an excerpt cut its start)
    last_frame_run_phase: str | None = None
    startup: bool = False  # the running traceback has a frame of the engine starting
    after_frame: bool = False  # the stream's last line was a `File "…"` frame line (its source line is next)
    loose_code: str = ""  # a logged source line outside a traceback (an excerpt that starts inside one)
    wrapper_head: Candidate | None = None  # a logged wrapper line: heads a traceback if the next line starts one
    cut_head: Candidate | None = None  # the wrapper line heading the running traceback
    title: Candidate | None = None  # a wrapper that titles the running traceback (Ray's `RayTaskError(X): ray::…`)
    framed: Late | None = None  # the running traceback's placing frame, as evidence of where the run was

    def is_idle(self) -> bool:
        """Nothing open in the stream: a line without needles cannot change what its next lines mean."""
        return (
            self.state == IDLE
            and not self.suppress
            and self.frame_phase is None
            and self.frame_context is None
            and self.header is None
            and self.unplaced is None
            and self.reservation is None
            and self.pending is None
        )

    def clear_frames(self) -> None:
        self.frame_phase, self.frame_line, self.frame_context = None, "", None
        self.last_frame, self.startup, self.cut_head, self.framed = None, False, None, None

    def give_frames(self, cand: Candidate) -> None:
        """The traceback that just ended placed this candidate (or did not): its frames are the candidate's."""
        cand.frame_phase, cand.frame_line, cand.frame_context = self.frame_phase, self.frame_line, self.frame_context
        cand.startup = cand.startup or self.startup
        self.clear_frames()


_KEPT_FRAMES = 4096  # frame lines whose verdicts are kept, each kind
_T = TypeVar("_T")


class Frames:
    """What a traceback's lines say: the outermost frame that places the error, the first context frame,
    whether the engine was starting."""

    def __init__(self, rules: Rules, arbiter: Arbiter, phases: PhaseTracker) -> None:
        self._rules = rules
        self._arbiter = arbiter
        self._phases = phases
        self._contexts = tuple(c for c in rules.contexts if c.frames is not None)
        # What frame lines said (see _said)
        self._hints: dict[str, FrameHint | None] = {}
        self._contexts_of: dict[str, Context | None] = {}
        self._startups: dict[str, bool] = {}

    def read(self, st: Stream, msg: str) -> None:
        rules = self._rules
        if "\\" in msg:
            msg = msg.replace("\\", "/")  # a Windows build's paths (`File "C:\\…\\vllm\\worker\\gpu_worker.py"`)
        if st.frame_phase is None and (hint := self._hint(msg)) is not None:
            st.frame_phase, st.frame_line = hint.phase, msg.strip()
            st.framed = self._phases.framed(hint.phase)
        elif st.framed is not None:
            self._phases.framing(st.framed)
        if st.frame_context is None and self._contexts and (context := self._context(msg)) is not None:
            st.frame_context = context
        if not st.startup and rules.startup_frames is not None and self._startup(msg):
            st.startup = True
            if st.unplaced is not None:
                st.unplaced.startup = True  # a chained traceback of the engine starting encloses it
        cand = st.unplaced
        if cand is not None and st.frame_phase is not None:
            # The traceback chained to an unplaced exception encloses it: its frames place it.
            cand.frame_phase, cand.frame_line = st.frame_phase, f"{st.frame_line} (chained traceback)"
            cand.frame_context = cand.frame_context or st.frame_context
            self._arbiter.place(st)

    def _hint(self, msg: str) -> FrameHint | None:
        """The frame hint that places a frame line, if any (kept per line, see _said)."""
        rules = self._rules

        def hint() -> FrameHint | None:
            if not rules.frame_gate.search(msg):
                return None
            return next(h for h in rules.frame_hints if h.pattern.search(msg))

        return self._said(self._hints, msg, hint)

    def _context(self, msg: str) -> Context | None:
        """The context a frame line shows, if any (kept per line)."""
        rules = self._rules

        def context() -> Context | None:
            if not rules.context_frame_gate.search(msg):
                return None
            return next(c for c in self._contexts if c.frames and c.frames.search(msg))

        return self._said(self._contexts_of, msg, context)

    def _startup(self, msg: str) -> bool:
        """Whether a frame line shows the engine starting (kept per line)."""
        startup = self._rules.startup_frames
        return startup is not None and self._said(self._startups, msg, lambda: startup.search(msg) is not None)

    @staticmethod
    def _said(kept: dict[str, _T], msg: str, read: Callable[[], _T]) -> _T:
        """What a frame line says, kept: a log repeats its tracebacks (a failing request's, every time it
        fails), and the gates (alternations of many patterns) take tens of microseconds a line."""
        if msg in kept:
            return kept[msg]
        if len(kept) >= _KEPT_FRAMES:
            kept.clear()
        said = kept[msg] = read()
        return said


class TracebackTracker:
    """Routes each line by its stream's state: structure and frames here, error lines to the intake,
    the other lines to the phase tracker."""

    def __init__(
        self,
        rules: Rules,
        cursor: Cursor,
        phases: PhaseTracker,
        arbiter: Arbiter,
        frames: Frames,
        intake: ErrorLines,
    ) -> None:
        self._rules = rules
        self._tb = rules.traceback
        self._code = rules.line.code
        self._error_levels = rules.line.error_levels
        self._warning_levels = rules.line.warning_levels
        self._warned = rules.warned_gate
        self._cursor = cursor
        self._phases = phases
        self._arbiter = arbiter
        self._frames = frames
        self._intake = intake
        self.streams: dict[tuple[str, str], Stream] = {}
        self._last_key_of_proc: dict[str, tuple[str, str]] = {}
        self._touched: dict[tuple[str, str], Stream] = {}  # streams that may be busy (see settled())
        # The line read last, its number and whether it came while its stream was open (see _unwrapped).
        self._before: tuple[int, LogLine, bool] | None = None
        self._widths: deque[int] = deque(maxlen=_WRAP_RECENT)  # widths of the last lines read (see _unwrapped)
        # The line read last when it was a logged error record with no message, as a candidate (see line()).
        self._blank_record: Candidate | None = None

    def settled(self, ok: Callable[[Stream], bool]) -> bool:
        """Whether every stream with lines since the last call passes `ok` (those that do are forgotten:
        only its own lines make a stream busy)."""
        for key, st in list(self._touched.items()):
            if self.streams.get(key) is st and not ok(st):
                return False
            del self._touched[key]
        return True

    def _unwrapped(self, ll: LogLine) -> LogLine:
        """A terminal's hard wrap undone: a line without prefix or header right after a prefixed or logged line of
        an open traceback or message that was cut at the wrap width continues it (read as one line of its stream).
        A line one column short of the width lost the space it was cut at. The width is the widest line since the
        stretch of open tracebacks began. Only lines whole-file analysis cannot jump over count: those that come
        while their own stream, or the stream of the line before, is open, and tracebacks' first and frame lines."""
        n = self._cursor.n
        own = self.streams.get((ll.proc, ll.src))
        read = (own is not None and not own.is_idle()) or (
            # (a traceback's first or frame line, before the first error: its needles are searched for)
            self._arbiter.first_error is None
            and (ll.level is None or ll.level in self._error_levels)
            and (self._tb.frame.match(ll.msg) is not None or self._tb.start.match(ll.msg) is not None)
        )
        before, self._before = self._before, (n, ll, read)
        prev = before[1] if before is not None and before[0] == n - 1 and before[2] else None
        st = self.streams.get((prev.proc, prev.src)) if prev is not None else None
        if st is None or st.is_idle():
            st = None
            if not self._before[2]:
                self._widths.clear()
                return ll
        width = len(ll.display)
        widest = max(self._widths, default=0)
        self._widths.append(width)
        if st is None or prev is None or not (prev.proc or prev.level) or ll.proc or ll.level is not None:
            return ll
        prev_width = len(prev.display)
        widest = max(widest, prev_width)
        if (
            prev_width < _WRAP_MIN_WIDTH
            or prev_width < widest - 1
            or width > widest
            or ll.msg.startswith("  ")
            or self._tb.start.match(ll.msg)
            or self._tb.exception.match(ll.msg)
        ):
            return ll
        rest = ll.msg.lstrip() if prev_width < widest else ll.msg
        gap = " " if rest is not ll.msg else ""
        joined = replace(prev, text=prev.text + gap + rest, msg=prev.msg + gap + rest)
        self._before = (n, joined, True)
        return joined

    def line(self, ll: LogLine, out: list[PhaseFinding | ErrorFinding]) -> None:
        raw, ll = ll, self._unwrapped(ll)
        key = (ll.proc, ll.src)
        st = self.streams.get(key)
        if st is None:
            st = self._new_stream(key)
        self._touched[key] = st
        self._switch(ll.proc, key)
        after_frame, st.after_frame = st.after_frame, False
        loose, st.loose_code = st.loose_code, ""
        head, st.wrapper_head = st.wrapper_head, None
        blank, self._blank_record = self._blank_record, None
        if ll.level is None and blank is not None and blank.key[0] == ll.proc and self._tb.start.match(ll.msg):
            # A logged error record with no message whose traceback follows without headers (V0's
            # `logger.exception`, `ERROR … [engine.py:467] ` then `Traceback …`): the traceback is the record's.
            blank.key = key
            st.header = blank
        elif ll.level in self._error_levels and st.is_idle() and not ll.msg.strip():
            self._blank_record = self._intake.candidate(st, ll, WEAK, None)
        if ll.level is not None and ll.level not in self._error_levels:
            arbiter = self._arbiter
            arbiter.resolve_header(st, starts_traceback=False)
            arbiter.end_message(st)
            arbiter.place(st)
            st.clear_frames()
            if ll.level in self._warning_levels and self._warned is not None and self._warned.search(ll.msg):
                self._intake.warned(st, ll)
            self._phases.quiet(ll, out)
        else:
            self._structure(st, ll, out, after_frame=after_frame, loose=loose, head=head)
        if raw is not ll:
            # (the context is the lines of the raw line's stream, as whole-file analysis reads them again)
            st = self.streams.get((raw.proc, raw.src)) or self._new_stream((raw.proc, raw.src))
        st.recent.append(raw.display)

    def _switch(self, proc: str, key: tuple[str, str]) -> None:
        """One process writes sequentially: a line of its other stream ends this one's message."""
        other = self._last_key_of_proc.get(proc)
        if other is not None and other != key:
            other_stream = self.streams.get(other)
            if other_stream is not None:
                self._arbiter.end_message(other_stream)
                self._arbiter.place(other_stream)
                self._arbiter.resolve_header(other_stream, starts_traceback=False)
        if len(self._last_key_of_proc) > _MAX_STREAMS:
            self._last_key_of_proc.clear()  # pids churn in long logs; this only speeds up message ends
        self._last_key_of_proc[proc] = key

    def _structure(
        self,
        st: Stream,
        ll: LogLine,
        out: list[PhaseFinding | ErrorFinding],
        *,
        after_frame: bool,
        loose: str,
        head: Candidate | None,
    ) -> None:
        """A line at an error level or not logged: traceback structure, an exception, or an error line."""
        msg = ll.msg
        tb = self._tb
        phases = self._phases
        if phases.stop_armed() and phases.is_stop(msg) and not self._code.match(msg):
            phases.stop(ll)
        if st.header is not None:
            # (a header may end with the traceback's first line: `EngineCore hit an exception: Traceback (…):`)
            starts = tb.start.match(msg) is not None or (
                tb.frame.match(msg) is not None and tb.start.search(st.header.msg) is not None
            )
            self._arbiter.resolve_header(st, starts_traceback=starts)
        if tb.start.match(msg):
            self._arbiter.end_message(st)
            st.state = FRAMES
            st.clear_frames()
            st.frames_from = self._cursor.n
            st.cut_head = head
            if head is None and tb.titled is not None and tb.titled.match(msg):
                self._intake.titled(st, ll)
                st.cut_head = self._intake.candidate(st, ll, WEAK, None)
        elif st.state == FRAMES and not msg.strip():
            pass  # a blank logged line inside a traceback's frames (a collector's or a logger's): not its end
        elif tb.chain.match(msg) or not msg.strip():
            # An exception's message ends; one no frame placed waits for the traceback chained to it.
            self._arbiter.end_message(st)
            st.state = IDLE
            st.suppress = False
        elif self._code.match(msg):
            self._code_line(st, ll, loose)
        elif st.state == FRAMES and after_frame and not tb.exception.match(msg):
            self._frames.read(st, msg)  # a frame's source line that a collector unindented
        elif st.state == FRAMES and tb.exception.match(msg):
            self._arbiter.place(st)
            self._intake.exception(st, ll)
            # Markers count in every line but traceback source and structure, whatever the stream's
            # state: so whole-file analysis need not follow tracebacks once the first error is known.
            phases.quiet(ll, out)
        else:
            if st.state == MESSAGE:
                self._continue_message(st, ll, match_rules=True)
            else:
                st.state = IDLE  # anything else ends a run of frames that had no exception line
                self._arbiter.place(st)
                self._intake.idle_line(st, ll)
            phases.quiet(ll, out)

    def _code_line(self, st: Stream, ll: LogLine, loose: str) -> None:
        """Source lines: a traceback's frames. Outside one only a frame line opens it (an excerpt that
        starts inside a traceback); other indented text is no error."""
        msg = ll.msg
        frame = self._tb.frame
        if st.state == MESSAGE:
            self._continue_message(st, ll, match_rules=False)
        elif st.state == FRAMES or frame.match(msg):
            if st.state != FRAMES:
                st.frames_from = self._cursor.n
                if loose:
                    self._frames.read(st, loose)  # the excerpt began with an outer frame's source line
            st.state = FRAMES
            self._frames.read(st, msg)
            if frame.match(msg):
                st.last_frame, st.last_frame_no, st.last_frame_run_phase = ll, self._cursor.n, self._phases.run_phase()
                st.after_frame = True
        elif ll.level is not None or self._cursor.n == 1:
            # (Only a logged one, or the log's first: whole-file reading may jump over another unlogged line without
            # needles.)
            st.loose_code = msg if msg.strip(" ^~") else loose  # (a `^^^` marker line keeps the code above it)

    def _continue_message(self, st: Stream, ll: LogLine, *, match_rules: bool) -> None:
        """A line that may continue the exception message above it (refines a generic one's category)."""
        st.message_lines += 1
        cand = st.pending
        if cand is not None and len(cand.after) < _CONTEXT_AFTER:
            cand.after.append(ll.display)
        follows = cand.rule.cause_follows if cand is not None and cand.rule is not None else None
        if cand is not None and follows is not None and follows.search(ll.msg):
            cand.cause = ll.msg.strip()
            self._arbiter.end_message(st)
            return
        if match_rules:
            quoting = self._arbiter.wrapper
            if cand is None and quoting is not None and quoting.line_no == self._cursor.n - st.message_lines:
                # (the message is a wrapper's quoted cause, over lines: `Worker failed with error 'at 1:0:`, then
                # Triton's source and its `ValueError("type fp8e4nv not supported …")`)
                cand = quoting if "cause" in quoting.groups else None
            self._intake.continuation(cand, ll)
        if st.message_lines >= self._tb.max_message_lines:
            self._arbiter.end_message(st)

    def _new_stream(self, key: tuple[str, str]) -> Stream:
        if len(self.streams) >= _MAX_STREAMS:
            # The oldest idle streams go first: how many idle ones a log had must not change its result
            # (whole-file analysis never sees the streams of lines it jumps over).
            by_age = sorted(self.streams, key=lambda k: not self.streams[k].is_idle())
            for old in by_age[: _MAX_STREAMS // 4]:
                stream = self.streams.pop(old)
                self._touched.pop(old, None)
                if stream.header is not None:
                    self._arbiter.add_weak(stream.header)
        st = Stream()
        self.streams[key] = st
        return st
