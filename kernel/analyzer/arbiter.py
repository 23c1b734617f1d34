"""Which error is the first. Candidates, strongest first: a line a root rule names (certain at once); an
exception that ends a traceback, or an exception-shaped line, that no rule names (certain when its message
stops continuing: at most `max_message_lines` lines of its stream or `max_wait_lines` lines overall); a logged
ERROR line without a traceback (only at close()); a wrapper (only at close(), only when there is nothing else).

Among strong candidates the earliest line wins; a later one is not reported while an earlier one is still
uncertain. A logged ERROR line followed by a traceback holds its place until the traceback ends (at most
`header_wait_lines`): it is the root-cause line when it repeats the exception's message. An error nothing
places waits up to `max_wait_lines` lines for a line that says where the run was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from kernel.analyzer.candidates import GENERIC, RULE, WEAK, WRAPPER, Candidate, Cursor, Late, groups
from kernel.analyzer.classify import Classifier
from kernel.analyzer.findings import ErrorFinding
from kernel.analyzer.lines import LogLine
from kernel.analyzer.phases import PhaseTracker, Placer
from kernel.analyzer.rules import ErrorRule, Rules
from kernel.analyzer.traceback import FRAMES, IDLE, MESSAGE, Frames, Stream

_MAX_WEAK = 16
_MAX_DEMOTED = 8
_DEMOTED_WINDOW = 4096  # lines after the first error in which wrappers are still listed (they follow it closely)
# What a wrapper or marker right after the error overrides: the error waits for one (ErrorFinding.phase_from).
_UNPLACED = frozenset({"unknown", "default", "rule_in_startup", "rule_usual"})


class Arbiter:
    """Holds the candidates: the uncertain ones, the earliest certain one, the weak ones and the first
    wrapper; emits the first error once nothing earlier can still win."""

    def __init__(
        self, rules: Rules, cursor: Cursor, phases: PhaseTracker, placer: Placer, classifier: Classifier
    ) -> None:
        self._tb = rules.traceback
        self._cursor = cursor
        self._phases = phases
        self._placer = placer
        self._classifier = classifier
        self.open: list[Candidate] = []  # uncertain strong candidates and held header places
        self.best: Candidate | None = None  # earliest certain strong candidate
        self.weak: list[Candidate] = []
        self.wrapper: Candidate | None = None
        self.warned: Candidate | None = None  # the first root cause logged as a warning (rules' `warned`)
        self.first_error: ErrorFinding | None = None
        self.emitted: Candidate | None = None
        self.last_oom_line = 0
        self.later_oom = False  # after the first error: whether a later OOM makes it secondary
        self.demoted: list[tuple[int, str]] = []  # wrappers passed over, for --explain

    def add_weak(self, cand: Candidate) -> None:
        cand.tier = WEAK
        if len(self.weak) < _MAX_WEAK:
            self.weak.append(cand)

    def settle(self, cand: Candidate) -> None:
        """A strong candidate became certain: keep it if it is the earliest."""
        category = self._classifier.category(cand) if cand.tier <= GENERIC else None
        if category == "oom":
            self.last_oom_line = max(self.last_oom_line, cand.line_no)
        if self.first_error is not None:
            return
        if self.best is None or cand.line_no < self.best.line_no:
            self.best = cand

    def unplaced(self, cand: Candidate) -> bool:
        """No frame places the error and its phase is not already certain."""
        rule = cand.rule
        return cand.frame_phase is None and cand.run_phase != "request" and not (rule is not None and rule.phase_fixed)

    def end_message(self, st: Stream) -> None:
        """The stream's exception message ended: its candidate is certain, or waits for a chained traceback."""
        if st.state == MESSAGE:
            st.state = IDLE
        cand, st.pending = st.pending, None
        if cand is None:
            return
        if self.unplaced(cand):
            self.place(st)
            st.unplaced = cand  # stays open: a chained traceback's frames may place it (traceback.Frames)
        else:
            self.open.remove(cand)
            self.settle(cand)

    def place(self, st: Stream) -> None:
        """The unplaced exception of this stream is as placed as it gets: it becomes certain."""
        cand, st.unplaced = st.unplaced, None
        if cand is not None:
            self.open.remove(cand)
            self.settle(cand)

    def resolve_header(self, st: Stream, *, starts_traceback: bool) -> None:
        """A logged ERROR line heads the traceback that starts right after it (it holds its place), or is weak."""
        header, st.header = st.header, None
        if header is None:
            return
        if starts_traceback and not st.suppress:
            header.reserved = True
            st.reservation = header
            self.open.append(header)
        else:
            self.add_weak(header)

    def expire(self, streams: Mapping[tuple[str, str], Stream], force: bool = False) -> None:
        """Settles the open candidates that waited long enough (every one when `force`)."""
        tb = self._tb
        for cand in list(self.open):
            waited = math.inf if force else self._cursor.n - cand.opened_at
            if cand.reserved and waited > tb.header_wait_lines:
                self.open.remove(cand)
                stream = streams.get(cand.key)
                if stream is not None and stream.reservation is cand:
                    stream.reservation = None
                self.add_weak(cand)
            elif not cand.reserved and waited > tb.max_wait_lines:
                stream = streams.get(cand.key)
                if stream is not None and cand in (stream.pending, stream.unplaced):
                    if stream.pending is cand:
                        self.end_message(stream)
                    self.place(stream)
                else:
                    self.open.remove(cand)
                    self.settle(cand)

    def close(self, streams: Iterable[Stream]) -> ErrorFinding | None:
        """End of the log: what was uncertain is settled; a weak candidate or the wrapper wins if nothing else."""
        for cand in self.open:
            if cand.reserved:
                cand.reserved = False
                cand.tier = GENERIC
            self.settle(cand)
        self.open.clear()
        streams = tuple(streams)
        for stream in streams:
            if stream.header is not None:
                self.add_weak(stream.header)
                stream.header = None
            if self.first_error is None and not self._phases.stopped_at:
                self._cut_traceback(stream)
        if self.first_error is not None:
            return None
        wrapper = self.wrapper
        quoted = wrapper if wrapper is not None and wrapper.groups.get("cause") else None
        # (A wrapper quoting a cause, `Worker failed with error 'CUDA out of memory…'` or one no rule names, outranks
        # the weak lines after it: a worker's death without a traceback, in its engine core or another data-parallel
        # one, is the survivors' reaction to that cause.)
        weak = [c for c in self.weak if quoted is None or c.start() < quoted.line_no]
        if self.best is None and weak:
            self.best = min(weak, key=Candidate.start)
        if self.best is None and self.wrapper is not None:
            self.best = self.wrapper
        return self.emit(streams, force=True)

    def _cut_traceback(self, st: Stream) -> None:
        """The log ended inside a traceback, before its exception line (an excerpt cut short): the failure is
        still there, named by the traceback's logged header or else its last frame, with less confidence."""
        if st.state != FRAMES or st.last_frame is None or st.suppress:
            return
        cand = st.reservation or st.cut_head
        if cand is st.cut_head and cand is not None:
            self.add_weak(cand)
        wrapper = self.wrapper
        if cand is None and wrapper is not None and wrapper.key[0] == st.last_frame.proc:
            return  # the process's own exit re-raising the exception its wrapper line already reported
        if cand is None:
            ll = st.last_frame
            cand = Candidate(
                line_no=st.last_frame_no,
                display=ll.display,
                msg=ll.msg,
                tier=WEAK,
                rule=None,
                run_phase=st.last_frame_run_phase,
                context=None,
                before=(),
                key=(ll.proc, ll.src),
                opened_at=self._cursor.n,
                src=ll.src,
                began=st.frames_from,
            )
            self.add_weak(cand)
        cand.cut = True
        cand.frame_phase, cand.frame_line = st.frame_phase, st.frame_line
        cand.frame_context, cand.startup = st.frame_context, st.startup

    def emit(self, streams: Iterable[Stream], force: bool = False) -> ErrorFinding | None:
        """The earliest certain candidate as the first error, unless an earlier one is open or (before `force`)
        a line right after it may still say where the run was (EngineDeadError right after a serving failure)."""
        best = self.best
        if best is not None and self.warned is not None and self.warned.line_no < best.line_no:
            best = self.best = self.warned  # a later error followed the warning: it was the root cause
        if best is None or any(c.line_no < best.line_no for c in self.open):
            return None
        placed = self._placer.placed(best)
        if placed[2] in _UNPLACED and not force and self._cursor.n - best.line_no <= self._tb.max_wait_lines:
            return None
        categorized = self._classifier.categorized(best)
        finding = self._classifier.finding(best, placed, categorized, self.secondary(best, categorized[0]))
        self.first_error = finding
        self.emitted = best
        self.open.clear()
        self.weak.clear()
        for stream in streams:
            stream.header = stream.reservation = stream.pending = stream.unplaced = None
        # From now on only a later OOM matters (it makes this one's OOM secondary), and wrappers to list.
        self.later_oom = categorized[0] != "oom"
        self._classifier.narrow(self.later_oom)
        self._phases.searching = False
        return finding

    def secondary(self, cand: Candidate, category: str) -> bool:
        """Whether the error's OOM follows from something else, or a later OOM follows from the error."""
        if category == "oom":
            if any(rule is not None and rule.secondary_oom for rule in (cand.rule, cand.refined)):
                return True
            context = cand.frame_context or cand.context
            return context is not None and context.secondary_oom
        return cand.tier <= GENERIC and self.last_oom_line > cand.line_no

    def listing_wrappers(self) -> bool:
        """Whether a wrapper is still listed: the first few, close after the first error (if any)."""
        error = self.first_error
        n = self._cursor.n
        return len(self.demoted) < _MAX_DEMOTED and (error is None or n - error.line_no <= _DEMOTED_WINDOW)

    def demote(self, rule: ErrorRule, ll: LogLine) -> None:
        if self.listing_wrappers():
            n = self._cursor.n
            self.demoted.append((n, f"wrapper passed over: line {n} ({rule.id}): {ll.display}"))

    def after_first(self, rule: ErrorRule | None, ll: LogLine) -> None:
        """Once the first error is out, a line matters only as a later OOM or as a wrapper to list (the
        classifier matches only those rules then)."""
        if rule is None:
            return
        if rule.kind == "wrapper":
            self.demote(rule, ll)
        if rule.category == "oom" and self.later_oom:
            self.last_oom_line = self._cursor.n


class ErrorLines:
    """The arbiter's intake: what an error line outside a traceback, or a traceback's exception line, opens
    (a rule's candidate, a generic exception whose message may continue, a header, a wrapper), and how strong."""

    def __init__(
        self,
        rules: Rules,
        cursor: Cursor,
        phases: PhaseTracker,
        placer: Placer,
        classifier: Classifier,
        arbiter: Arbiter,
        frames: Frames,
    ) -> None:
        self._tb = rules.traceback
        self._cursor = cursor
        self._phases = phases
        self._placer = placer
        self._classifier = classifier
        self._arbiter = arbiter
        self._frames = frames

    def candidate(self, st: Stream, ll: LogLine, tier: int, rule: ErrorRule | None) -> Candidate:
        """The line as a candidate, with where the run and its stream's traceback were."""
        n = self._cursor.n
        return Candidate(
            line_no=n,
            display=ll.display,
            msg=ll.msg,
            tier=tier,
            rule=rule,
            run_phase=self._phases.run_phase(),
            context=self._phases.context(),
            before=tuple(st.recent),
            key=(ll.proc, ll.src),
            opened_at=n,
            src=ll.src,
            frame_phase=st.frame_phase,
            frame_line=st.frame_line,
            frame_context=st.frame_context,
            groups=groups(rule, ll.msg),
            startup=st.startup,
        )

    def idle_line(self, st: Stream, ll: LogLine) -> None:
        """A line outside any traceback, at an error level or unlogged."""
        msg = ll.msg
        arbiter = self._arbiter
        rule = self._classifier.match(msg)
        if arbiter.first_error is not None:
            arbiter.after_first(rule, ll)
            return
        if self._phases.stopped_at:
            self._phases.echoes += rule is not None or ll.level is not None or bool(self._tb.standalone.match(msg))
            return
        if rule is not None:
            self._named(st, ll, rule)
        elif self._tb.standalone.match(msg):
            cand = self.candidate(st, ll, GENERIC, None)
            st.pending, st.state, st.message_lines = cand, MESSAGE, 0
            arbiter.open.append(cand)
        elif ll.level is not None:
            # A logged error record's other lines are traceback content (collectors may strip the
            # indentation), so they can place the error too.
            self._frames.read(st, msg)
            st.header = self.candidate(st, ll, WEAK, None)

    def warned(self, st: Stream, ll: LogLine) -> None:
        """A warning line: a root cause when a `warned` rule names it and a later error follows (Arbiter.emit)."""
        arbiter = self._arbiter
        if arbiter.first_error is not None or arbiter.warned is not None:
            return
        rule = self._classifier.match(ll.msg)
        if rule is not None and rule.warned:
            arbiter.warned = self.candidate(st, ll, RULE, rule)
            if rule.phase_fixed:
                self._phases.evidence(rule.phase)

    def titled(self, st: Stream, ll: LogLine) -> None:
        """A traceback's first line that a wrapper rule names (Ray's outer `RayTaskError(X): ray::Task() (pid=…)`):
        the last resort, as any wrapper, until the task's own exception at the traceback's end replaces it."""
        rule = self._classifier.match(ll.msg)
        if rule is None or rule.kind != "wrapper" or self._arbiter.first_error is not None:
            return
        self.wrapped(rule, st, ll)
        st.title = self._arbiter.wrapper

    def _named(self, st: Stream, ll: LogLine, rule: ErrorRule) -> None:
        """A line outside a traceback that a rule names."""
        if rule.kind == "wrapper":
            self.wrapped(rule, st, ll)
            if self._tb.standalone.match(ll.msg) and groups(rule, ll.msg).get("cause") is not None:
                # The cause it quotes goes on (CUDA's `Search for cudaError…` line): those lines continue this
                # one and never stand for an error of their own.
                st.pending, st.state, st.message_lines = None, MESSAGE, 0
        elif rule.kind == "benign":
            st.suppress = rule.suppress_traceback
        elif rule.kind == "weak":
            self._arbiter.add_weak(self.candidate(st, ll, WEAK, rule))
            if rule.phase_fixed:
                self._phases.evidence(rule.phase)  # like a marker: the run was there
        else:
            cand = self.candidate(st, ll, RULE, rule)
            if self._tb.standalone.match(ll.msg):
                st.state, st.message_lines = MESSAGE, 0
            if st.state == MESSAGE and (
                rule.cause_follows is not None or (cand.run_phase is None and self._arbiter.unplaced(cand))
            ):
                # (A log without markers: a traceback chained to it may still place it, as for an
                # exception that ends a traceback.)
                st.pending = cand
                self._arbiter.open.append(cand)
            else:
                self._arbiter.settle(cand)

    def exception(self, st: Stream, ll: LogLine) -> None:
        """The line that ends a traceback."""
        arbiter = self._arbiter
        st.state, st.message_lines = MESSAGE, 0
        reservation, st.reservation = st.reservation, None
        if reservation is not None:
            arbiter.open.remove(reservation)
        if st.suppress:
            st.suppress = False
            return
        msg = ll.msg
        rule = self._classifier.match(msg)
        if arbiter.first_error is not None:
            arbiter.after_first(rule, ll)
            return
        if self._phases.stopped_at and reservation is None:
            self._phases.echoes += 1
            st.clear_frames()
            return
        if rule is not None and rule.kind not in ("root", "weak"):
            if rule.kind == "wrapper":
                self.wrapped(rule, st, ll)
            return
        if rule is not None and rule.kind == "weak":
            rule = None  # an exception line is stronger evidence than a library's warning it happens to quote
        tier = RULE if rule is not None else GENERIC
        told = msg.partition(": ")[2].strip()
        if reservation is not None and len(told) >= 8 and told in reservation.msg:
            cand = reservation
            cand.reserved, cand.tier, cand.rule = False, tier, rule
            cand.groups = groups(rule, msg)
        else:
            if reservation is not None:
                arbiter.add_weak(reservation)
            cand = self.candidate(st, ll, tier, rule)
        st.give_frames(cand)
        if tier == RULE and not arbiter.unplaced(cand) and (rule is None or rule.cause_follows is None):
            arbiter.settle(cand)
        else:
            st.pending = cand
            arbiter.open.append(cand)

    def continuation(self, cand: Candidate | None, ll: LogLine) -> None:
        """A line that continues an exception's message: a root rule it matches refines a generic exception's
        category (or, elsewhere, is an OOM that comes later)."""
        rule = self._classifier.match(ll.msg)
        if rule is not None and self._arbiter.first_error is not None:
            self._arbiter.after_first(rule, ll)  # whatever the stream's state, as whole-file analysis sees it
        elif rule is not None and rule.kind == "root":
            if cand is not None and (cand.rule is None or cand.tier == WRAPPER) and cand.refined is None:
                # (a wrapper whose quoted cause goes on over lines: the rule naming one of them names the cause)
                cand.refined = rule
                cand.groups = {**groups(rule, ll.msg), **cand.groups} if cand.tier == WRAPPER else groups(rule, ll.msg)
            elif rule.category == "oom":
                self._arbiter.last_oom_line = self._cursor.n

    def wrapped(self, rule: ErrorRule, st: Stream, ll: LogLine) -> None:
        """A wrapper: evidence of where the run was, listed for --explain, and the first one kept as the last
        resort (with the cause it quotes classified by the root rules)."""
        self._phases.evidence(rule.phase)
        method = groups(rule, ll.msg).get("method")
        phase = rule.phase or (self._placer.frame_hint(f"in {method}") if method else None)
        if phase is not None or rule.startup:
            what = f"{rule.id}" + (f", method {method}" if method else "")
            self._phases.late.append(Late(self._cursor.n, phase, what, rule.startup))
        if ll.level is not None:
            st.wrapper_head = self.candidate(st, ll, WEAK, None)
        self._arbiter.demote(rule, ll)
        title, st.title = st.title, None
        kept = self._arbiter.wrapper
        # (a shutdown's reaction, uvicorn's lifespan task cancelled, gives way to a later wrapper naming the failure)
        if kept is None or kept is title or (kept.rule is not None and kept.rule.reaction and not rule.reaction):
            cand = self._arbiter.wrapper = self.candidate(st, ll, WRAPPER, rule)
            cause = cand.groups.get("cause")
            if cause is not None:
                cand.refined = self._classifier.quoted_cause(cause)
                cand.groups = {**groups(cand.refined, cause), **cand.groups}
        st.clear_frames()
