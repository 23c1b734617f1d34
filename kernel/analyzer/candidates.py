"""What the analyzer's parts hand each other: the candidates for the first error, the lines that say where
the run was, and the line count they all number lines by."""

from __future__ import annotations

from dataclasses import dataclass, field

from kernel.analyzer.rules import Context, ErrorRule
from protos.vocab import PHASES

# Candidate tiers, strongest first: a root rule's line, an exception no rule names, a logged ERROR line, a wrapper.
RULE, GENERIC, WEAK, WRAPPER = 1, 2, 3, 4
_PHASE_ORDER = {phase: i for i, phase in enumerate(PHASES)}


@dataclass(slots=True)
class Cursor:
    """The number of the line read last (lines jumped over by whole-file analysis count too): one count for
    every part, so that the line numbers they record agree."""

    n: int = 0


@dataclass(slots=True)
class Late:
    """A line that says where the run was (a wrapper's phase or method, a marker) or that it was starting."""

    line_no: int
    phase: str | None
    what: str
    startup: bool = False
    context: Context | None = None  # a context the marker's line started (the capture's progress bar)
    until: int = 0  # a traceback's placing frame: the line its traceback had reached (it spans the lines up to it)


@dataclass(slots=True)
class Candidate:
    """A line that may be the first error, with what its stream knew about it when it was read."""

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
    # Where it began, when not on its own line: a cut traceback named by its last frame began on its first (two
    # processes' cut tracebacks interleaved: the one logged first is the earlier error).
    began: int = 0

    def start(self) -> int:
        return self.began or self.line_no


def later(phase: str | None, than: str | None) -> bool:
    """Whether `phase` comes after `than` in a launch (None: before the first phase)."""
    if phase is None:
        return False
    return than is None or _PHASE_ORDER[phase] > _PHASE_ORDER[than]


def groups(rule: ErrorRule | None, msg: str) -> dict[str, str]:
    """The named groups the rule's pattern captures in `msg` (the hint's and the signature's fields)."""
    if rule is None or not rule.pattern.groupindex:
        return {}
    match = rule.pattern.search(msg)
    if match is None:
        return {}
    return {k: v for k, v in match.groupdict().items() if v is not None}
