"""Classification: which rule names a line, and the category, hint and reasons of the first error once it is
chosen. The rules themselves are data (rules.toml); this is how their fields combine."""

from __future__ import annotations

from kernel.analyzer.candidates import WEAK, WRAPPER, Candidate
from kernel.analyzer.findings import ErrorFinding
from kernel.analyzer.phases import PhaseTracker, Placer
from kernel.analyzer.rules import ErrorRule, Rules, gate
from kernel.analyzer.signature import signature

_KEPT_MESSAGES = 4096  # messages whose rule is kept


class Classifier:
    """Rule → category, hint and confidence; it also words why (`k3repro analyze --explain`).

    Wrappers quote or follow the cause: when one is all there is, the cause it quotes (`Worker failed with
    error '...'`, `RayTaskError(DistBackendError)`) is classified by the root rules.
    """

    def __init__(self, rules: Rules, placer: Placer, phases: PhaseTracker) -> None:
        self._rules = rules
        self._placer = placer
        self._phases = phases
        self._rule_list = rules.rules
        self._rule_gate = rules.rule_gate
        # Messages' rules, kept: a log repeats its error lines (a failing request's, every time it fails), and
        # the gate (an alternation of every rule) takes up to hundreds of microseconds a line.
        self._matched: dict[str, ErrorRule | None] = {}

    def match(self, msg: str) -> ErrorRule | None:
        """The first rule that names the line (a gate of all of them rules most lines out at once)."""
        if msg in self._matched:
            return self._matched[msg]
        if len(self._matched) >= _KEPT_MESSAGES:
            self._matched.clear()
        rule = self._matched[msg] = self._first_rule(msg)
        return rule

    def _first_rule(self, msg: str) -> ErrorRule | None:
        if not self._rule_gate.search(msg):
            return None
        for rule in self._rule_list:
            if rule.pattern.search(msg):
                return rule
        return None

    def narrow(self, later_oom: bool) -> None:
        """The first error is out: only wrappers (to list) and, when it was no OOM, a later OOM still count."""
        self._rule_list = tuple(
            r for r in self._rules.rules if r.kind == "wrapper" or (later_oom and r.category == "oom")
        )
        self._rule_gate = gate(r.pattern for r in self._rule_list)
        self._matched.clear()

    def quoted_cause(self, cause: str) -> ErrorRule | None:
        """The root rule that names the cause a wrapper quotes."""
        return next((r for r in self._rules.rules if r.kind == "root" and r.pattern.search(cause)), None)

    def category(self, cand: Candidate) -> str:
        return self.categorized(cand)[0]

    def categorized(self, cand: Candidate) -> tuple[str, str]:
        """The error's category and what decided it."""
        rules = self._rules
        rule = cand.rule
        if rule is not None and rule.category is not None:
            return rule.category, f"rule {rule.id}"
        if cand.tier == WRAPPER and rule is not None and rule.hang:
            phase = self._placer.phase_of(cand)
            category = rules.category_by_phase.get(phase, rules.default_category)
            return category, f"a hang in {phase}, categorized like one"
        if cand.tier == WRAPPER:
            if "cause" not in cand.groups:
                phase = self._placer.phase_of(cand)
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
        late = self._phases.late_after(cand.line_no) if cand.run_phase is None else None
        context = cand.frame_context or cand.context or (late.context if late is not None else None)
        if context is not None and context is not cand.frame_context and self._causeless_wrapper(cand):
            # (a cut traceback headed by a wrapper that names no cause: the log's stretch places it, the
            # wrapper's rule says its category is its phase's)
            context = None
        if context is not None and context.category is not None:
            by = "its traceback's frames" if context is cand.frame_context else "the log"
            return context.category, f"it happened during {context.name} (by {by})"
        phase = self._placer.phase_of(cand)
        if rule is not None and phase in rule.category_by_phase:
            return rule.category_by_phase[phase], f"rule {rule.id} in {phase}"
        category = rules.category_by_phase.get(phase, rules.default_category)
        return category, f"no rule names it: the category of an error in {phase}"

    def _causeless_wrapper(self, cand: Candidate) -> bool:
        """Whether the cut traceback's line is a wrapper's that names no cause (`EngineCore failed to start.`)."""
        if not cand.cut:
            return False
        for rule in self._rules.rules:
            if rule.kind == "wrapper" and not rule.hang:
                match = rule.pattern.search(cand.msg)
                if match is not None:
                    return match.groupdict().get("cause") is None
        return False

    def hint(self, cand: Candidate, category: str) -> str:
        for rule in (cand.rule, cand.refined):
            if rule is not None and rule.hint is not None:
                try:
                    return rule.hint.format_map(cand.groups)
                except KeyError:
                    pass
        return self._rules.category_hint(category)

    def chosen(self, cand: Candidate) -> str:
        """Why this line is the first error."""
        rule = cand.rule
        if cand.tier == WRAPPER and rule is not None and rule.hang:
            return f"the launch was interrupted ({rule.id}) before it was ready: the finding is the hang before it"
        if cand.tier == WRAPPER and rule is not None:
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
        if cand.tier == WEAK:
            return "a logged ERROR line: the log has no exception or rule-named error"
        refined = f" (its message matches {cand.refined.id})" if cand.refined is not None else ""
        return f"the earliest exception, which no rule names{refined}"

    def finding(
        self, best: Candidate, placed: tuple[str, str, str], categorized: tuple[str, str], secondary: bool
    ) -> ErrorFinding:
        """The chosen candidate as the first error: its phase and category decided, its hint worded."""
        phase, phase_why, phase_from = placed
        category, category_why = categorized
        hint = self.hint(best, category)
        if secondary:
            oom_hint = self._rules.secondary_oom_hint
            hint = f"{hint} {oom_hint}".strip() if category != "oom" else (oom_hint or hint)
        context = best.frame_context or best.context
        during = context.name if context is not None else ""
        if best.tier == WRAPPER and best.rule is not None and best.rule.hang:
            during = "hang"
        return ErrorFinding(
            phase=phase,
            category=category,
            line=best.display,
            line_no=best.line_no,
            context=(*best.before, best.display, *best.after),
            secondary_oom=secondary,
            signature=signature(self._rules, phase, category, f"{best.msg} {best.cause}".rstrip()),
            hint=hint,
            during=during,
            why=(
                f"line: {self.chosen(best)}",
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
