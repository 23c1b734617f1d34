"""What the analyzer reports: its own module so that the parts that build findings and the callers that read
them need not import the analyzer itself."""

from __future__ import annotations

from dataclasses import dataclass


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
    # "process" (the error's process prefix, by its rule's phase_in_process),
    # "method" (a worker RPC its line names), "request_id", "collective_seq", "rule" (only one phase is possible),
    # "wrapper_after"/"marker_after"/"frames_after" (a line or a traceback's frame right after it says where the run
    # was), "rule_in_startup" (where the rule's error happens, the engine starting), "rule_usual" (a compile-class
    # rule's phase), "default" (rules.toml's disclosed guess), "unknown" (phase "unknown": nothing places it; the
    # analyzer does not guess).
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
