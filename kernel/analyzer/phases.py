"""Where the run was: the phase tracker (markers, contexts, readiness, a deliberate stop) and the placer, which
says in which phase an error happened. Markers lag behind the code (ranks log at different times), frames do
not: the placer prefers what the error's own lines show and falls back on the markers."""

from __future__ import annotations

import re
from collections import deque

from kernel.analyzer.candidates import WRAPPER, Candidate, Cursor, Late, later
from kernel.analyzer.findings import ErrorFinding, PhaseFinding
from kernel.analyzer.lines import LogLine
from kernel.analyzer.rules import Context, ErrorRule, Marker, Rules, gate
from protos.vocab import UNKNOWN_PHASE

_MAX_LATE = 8  # lines kept as evidence of where the run was, after an error nothing else places
_MAX_MODULES = 512  # logger call sites whose phase is cached; long logs churn through many


class PhaseTracker:
    """The phase the markers reached, the log stretches (contexts) open, readiness and a stop on purpose.

    Only non-error lines that can still change something pass its gate: the markers of a new phase, the
    contexts' next edges, vLLM's waiting messages and, while serving, a stop notice.
    """

    def __init__(self, rules: Rules, cursor: Cursor) -> None:
        self._rules = rules
        self._cursor = cursor
        self.phase: str | None = None  # the phase the markers reached
        self.evidence_phase: str | None = None  # a later phase a rule-named line proved the run had reached
        self.ready = False
        self.seen: list[str] = []
        self.contexts: dict[str, Context] = {}
        # Lines after which an earlier error nothing else places is placed: wrappers, markers, placing frames.
        self.late: deque[Late] = deque(maxlen=_MAX_LATE)
        self.searching = True  # no first error yet (a stop notice then ends the search)
        self.stopped_at = 0  # line of the stop notice that ended a serving run (0: none)
        self.stop_line = ""
        self.echoes = 0  # error lines after the stop notice
        self.saw_idle = False  # the line read last was one of vLLM's waiting messages
        self.active_markers: tuple[Marker, ...] = ()
        self._gate = self.refresh()

    def run_phase(self) -> str | None:
        """Where the run is: serving once ready, else the later of the markers' and the evidence's phase."""
        if self.ready:
            return "request"
        phase = self.phase
        if later(self.evidence_phase, phase):
            phase = self.evidence_phase
        return phase

    def evidence(self, phase: str | None) -> None:
        """A line that happens only in `phase` proves the run got there, like a marker."""
        if later(phase, self.evidence_phase):
            self.evidence_phase = phase

    def context(self) -> Context | None:
        """The log stretch opened last and still open."""
        return next(reversed(self.contexts.values()), None) if self.contexts else None

    def edges(self) -> tuple[re.Pattern[str], ...]:
        """The contexts' next edges: the end of an open one, the start of the others."""
        return tuple(c.end if c.name in self.contexts else c.start for c in self._rules.contexts)

    def framed(self, phase: str) -> Late | None:
        """A traceback's frame placed its error in `phase`: for an earlier error nothing placed (an excerpt's cut
        logged traceback, then the process's own print of it), where the run was, as a wrapper would say."""
        if not self.searching:
            return None
        late = Late(self._cursor.n, phase, "frames")
        self.late.append(late)
        return late

    def framing(self, late: Late) -> None:
        """The traceback that `late`'s frame placed goes on to this line: an error another process logs inside it
        (interleaved ranks or data-parallel engine cores failing together) happened while it ran."""
        late.until = self._cursor.n

    def late_window(self, line_no: int) -> list[Late]:
        """The evidence lines within `max_wait_lines` after the line, and placing tracebacks running across it."""
        end = line_no + self._rules.traceback.max_wait_lines
        return [x for x in self.late if line_no < max(x.line_no, x.until) and x.line_no <= end]

    def late_after(self, line_no: int) -> Late | None:
        """The first line right after the line that says where the run was."""
        return next((x for x in self.late_window(line_no) if x.phase is not None), None)

    # -- a deliberate stop ----------------------------------------------------------------------

    def stop_armed(self) -> bool:
        """A stop notice would end the search: the server was serving and nothing failed yet."""
        return self.ready and not self.stopped_at and self.searching and self._rules.stop is not None

    def is_stop(self, msg: str) -> bool:
        stop = self._rules.stop
        return stop is not None and stop.search(msg) is not None

    def stop(self, ll: LogLine) -> None:
        self.stopped_at, self.stop_line = self._cursor.n, ll.display
        self.refresh()

    # -- markers and contexts -------------------------------------------------------------------

    def refresh(self) -> re.Pattern[str]:
        """The gate for non-error lines: only markers that can still change something (a new phase, the
        first sight of a phase, readiness, a new launch), the contexts' next edges and idle lines."""
        rules = self._rules
        self.active_markers = tuple(
            m
            for m in rules.markers
            if m.reset or (m.ready and not self.ready) or m.phase not in self.seen or later(m.phase, self.phase)
        )
        patterns = [m.pattern for m in self.active_markers]
        patterns += self.edges()
        if rules.idle is not None:
            patterns.append(rules.idle)
        if self.stop_armed():
            assert rules.stop is not None
            patterns.append(rules.stop)
        self._gate = gate(patterns)
        return self._gate

    def quiet(self, ll: LogLine, out: list[PhaseFinding | ErrorFinding]) -> None:
        """A line outside traceback structure: it may be idle, stop the server, open or close a context, or
        move the phase."""
        text = ll.text
        if not self._gate.search(text):
            return
        rules = self._rules
        if rules.idle is not None and rules.idle.search(text):
            self.saw_idle = True
        if self.stop_armed() and self.is_stop(ll.msg):
            self.stop(ll)
        changed = False
        started: Context | None = None
        for context in rules.contexts:
            if context.name in self.contexts:
                if context.end.search(text):
                    del self.contexts[context.name]
                    changed = True
            elif context.start.search(text):
                self.contexts[context.name] = started = context
                changed = True
        for marker in self.active_markers:
            if marker.pattern.search(text):
                if self.searching:
                    self.late.append(Late(self._cursor.n, marker.phase, "marker", context=started))
                self._marked(marker, ll, out)
                changed = True
                break
        if changed:
            self.refresh()

    def _marked(self, marker: Marker, ll: LogLine, out: list[PhaseFinding | ErrorFinding]) -> None:
        before = self.phase
        phase = marker.phase
        if marker.reset:
            self.phase = phase
            self.evidence_phase = None
            self.ready = False
            self.contexts.clear()
            self.stopped_at, self.stop_line = 0, ""
        elif later(phase, before):
            self.phase = phase
        if marker.ready:
            self.ready = True
        if phase not in self.seen:
            self.seen.append(phase)
        if self.phase != before:
            out.append(PhaseFinding(phase, ll.display, self._cursor.n))


class Placer:
    """The phase an error happened in, and what placed it (ErrorFinding.phase_from).

    The rule's phase when only one is possible; `request` once the server was ready; else the outermost
    traceback frame that places it (an exception without one waits for the traceback chained to it), else the
    logger's module, else a worker method its line names, a collective's sequence number or a request id, else
    the phase the markers reached, else a wrapper or marker right after it that says where the run was
    (EngineDeadError: serving), else, when its traceback or a wrapper shows the engine starting, where the rule's
    error happens in a start-up, else a compile-class rule's phase; else `unknown` (the arbiter lets such an
    error wait up to `max_wait_lines` lines for a line that places it).
    """

    def __init__(self, rules: Rules, phases: PhaseTracker) -> None:
        self._rules = rules
        self._phases = phases
        self._module_phases: dict[str, str | None] = {}

    def frame_hint(self, text: str) -> str | None:
        """The phase a frame hint gives `text` (a frame line, or a worker method a wrapper names)."""
        if not self._rules.frame_gate.search(text):
            return None
        return next(h.phase for h in self._rules.frame_hints if h.pattern.search(text))

    def _module_phase(self, src: str) -> str | None:
        """The phase the logger's call site runs in ([[module_hint]]); cached, call sites repeat."""
        if src not in self._module_phases:
            if len(self._module_phases) > _MAX_MODULES:
                self._module_phases.clear()
            hint = next((h for h in self._rules.module_hints if h.pattern.search(src)), None)
            self._module_phases[src] = hint.phase if hint else None
        return self._module_phases[src]

    def phase_of(self, cand: Candidate) -> str:
        return self.placed(cand)[0]

    def placed(self, cand: Candidate) -> tuple[str, str, str]:
        """The error's phase, what placed it, and the kind of evidence, strongest first."""
        rules = self._rules
        cand_rules = (cand.refined, cand.rule) if cand.tier == WRAPPER else (cand.rule, cand.refined)
        for rule in cand_rules:
            if rule is not None and rule.phase_fixed and rule.phase is not None:
                return rule.phase, f"{rule.id} happens only there", "rule"
        if cand.run_phase == "request":
            return "request", "the server was serving (a readiness marker came before)", "marker"
        if cand.frame_phase is not None:
            return cand.frame_phase, f"traceback frame {cand.frame_line}", "frames"
        proc = cand.key[0]
        for rule in cand_rules if proc else ():
            if rule is None:
                continue
            for phase, process in rule.phase_in_process.items():
                if process.search(proc):
                    return phase, f"{rule.id} in the process {proc}", "process"
        module = self._module_phase(cand.src) if cand.src else None
        if module is not None:
            return module, f"logged by {cand.src}", "module"
        named = rules.method_named.search(cand.msg) if rules.method_named is not None else None
        method_phase = self.frame_hint(f"in {named['method']}") if named is not None else None
        if named is not None and method_phase is not None:
            return method_phase, f"the worker method its line names ({named['method']})", "method"
        by_line = self._by_line(cand)
        if by_line is not None:
            return by_line
        return self._by_rule(cand, cand_rules)

    def _by_line(self, cand: Candidate) -> tuple[str, str, str] | None:
        """What the error's line says (a collective's number, a request id), else where the markers were."""
        seq = cand.groups.get("seq") or cand.groups.get("seq2")
        if seq is not None and seq.isdigit():
            # A collective's sequence number counts the collectives the group had done: start-up runs a few.
            done = int(seq)
            if done >= self._rules.serving_seq:
                return "request", f"collective number {done}: the engine had been running collectives", "collective_seq"
            if done <= 1:
                return "gpu_detect", f"collective number {done}: the group's first collective", "collective_seq"
        request = self._rules.request_evidence
        if request is not None and any(request.search(text) for text in (cand.msg, *cand.after)):
            return "request", "the error names a request (its id)", "request_id"
        if cand.run_phase is not None:
            return cand.run_phase, "the phase the log's markers had reached", "marker"
        return None

    def _by_rule(self, cand: Candidate, cand_rules: tuple[ErrorRule | None, ...]) -> tuple[str, str, str]:
        """Nothing before the error places it: a line right after it, else where its rule's error happens."""
        late = self._phases.late_after(cand.line_no)
        if late is not None and late.phase is not None:
            kind = late.what if late.what in ("marker", "frames") else "wrapper"
            return (
                late.phase,
                f"the {kind} right after it (line {late.line_no}, {late.what}) says where the run was",
                f"{kind}_after",
            )
        startup = cand.startup or any(x.startup for x in self._phases.late_window(cand.line_no))
        for rule in cand_rules:
            if startup and rule is not None and rule.phase is not None:
                why = f"where {rule.id} happens in a start-up (its traceback shows the engine starting)"
                return rule.phase, why, "rule_in_startup"
            if rule is not None and rule.phase_usual and rule.phase is not None:
                return rule.phase, f"where {rule.id} happens (its class: rules.toml phase_usual)", "rule_usual"
        if self._rules.default_phase != UNKNOWN_PHASE:
            return self._rules.default_phase, "nothing in the log places it: the default", "default"
        return UNKNOWN_PHASE, "nothing in the log places it: no phase is guessed", "unknown"
