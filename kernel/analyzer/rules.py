"""Loading rules.toml: the analyzer's knowledge as data, checked against the shared vocabulary.

Every regex is compiled here, once, and every phase or category id is checked against protos.vocab, so
a typo in the data fails at load time with the rule's id instead of misclassifying logs later.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal, cast

from kernel.analyzer.needles import needles_of
from kernel.toml_reader import ConfigError, TomlReader, packaged, read_toml
from protos.vocab import CATEGORIES, PHASES, UNKNOWN_PHASE

RuleKind = Literal["root", "wrapper", "benign", "weak"]
_KINDS: tuple[RuleKind, ...] = ("root", "wrapper", "benign", "weak")
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


class RulesError(ConfigError):
    """rules.toml cannot be used; the message names the file, the row and the key."""


@dataclass(frozen=True)
class LineSyntax:
    max_chars: int
    ansi: re.Pattern[str]
    wrappers: tuple[re.Pattern[str], ...]
    process: re.Pattern[str]
    suffixes: tuple[re.Pattern[str], ...]
    headers: tuple[re.Pattern[str], ...]
    error_levels: frozenset[str]
    code: re.Pattern[str]
    # A collector that re-logs each line as a quoted value (logfmt `msg="…"`): the line is that value, unescaped.
    quoted: re.Pattern[str] | None = None
    # A message logged below an error level that is a traceback's line (a wrapper re-logging another process's
    # output line by line at its own level): the level is the wrapper's, so the line is read as not logged.
    relogged: re.Pattern[str] | None = None
    # Where another logged line starts inside a line (a paste that lost its line ends): the line is read as those.
    joined: re.Pattern[str] | None = None
    # Levels of warnings: a rule marked `warned` names a root cause among their lines too.
    warning_levels: frozenset[str] = frozenset()


@dataclass(frozen=True)
class TracebackSyntax:
    start: re.Pattern[str]
    chain: re.Pattern[str]
    frame: re.Pattern[str]
    exception: re.Pattern[str]
    standalone: re.Pattern[str]
    max_message_lines: int
    max_wait_lines: int
    header_wait_lines: int
    # A traceback's first line that names what failed (Ray's task line): a traceback cut before its exception
    # line is named by it, as by a logged header.
    titled: re.Pattern[str] | None = None


@dataclass(frozen=True)
class Marker:
    phase: str
    pattern: re.Pattern[str]
    ready: bool
    reset: bool


@dataclass(frozen=True)
class Context:
    name: str
    start: re.Pattern[str]
    end: re.Pattern[str]
    category: str | None
    secondary_oom: bool
    frames: re.Pattern[str] | None  # traceback frames that put an error in this stretch


@dataclass(frozen=True)
class FrameHint:
    """A phase by a traceback frame ([[frame_hint]]) or by a logger's call site ([[module_hint]])."""

    phase: str
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class HangRule:
    """A hang's category by the last line the launch wrote before it stopped making progress."""

    category: str
    pattern: re.Pattern[str]
    hint: str


@dataclass(frozen=True)
class ErrorRule:
    id: str
    kind: RuleKind
    pattern: re.Pattern[str]
    category: str | None
    category_by_phase: Mapping[str, str]
    phase: str | None
    phase_fixed: bool
    secondary_oom: bool
    suppress_traceback: bool
    hang: bool  # a wrapper that interrupts a launch which stopped making progress
    phase_usual: bool  # `phase` places the error when nothing else does (its class happens there, with rare exceptions)
    startup: bool  # a wrapper raised only while the engine starts: the error before it happened in a start-up
    # A wrapper a shutdown raises (a task cancelled, an exit): any later wrapper naming a failure is the one told.
    reaction: bool
    hint: str | None
    examples: tuple[str, ...]
    # A continuation line of the message that names the cause (pydantic's `Value error, ...`): it joins the
    # signature, so that two errors of one class with different causes do not compare equal.
    cause_follows: re.Pattern[str] | None = None
    # A root cause vLLM logs as a warning and runs on from (its libraries failing to load): the first error
    # when a later error follows it, nothing in a log where none does.
    warned: bool = False
    # Phases the error's process places it in, by a pattern of its process prefix (`(APIServer pid=1)`: a bind that
    # fails in the API server's process is its listen); after its traceback's frames, before the log's markers.
    phase_in_process: Mapping[str, re.Pattern[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ScanSyntax:
    """What whole-file analysis searches for: the literal needles of the patterns (kernel.analyzer.needles)."""

    errors: frozenset[str]  # lines that can open or name an error: rules, exceptions, error levels, tracebacks
    oom: frozenset[str]  # a later OOM (what matters of errors once the first is known, with wrappers)
    wrappers: frozenset[str]  # wrappers, listed by --explain
    edges: Mapping[str, frozenset[str]]  # needles of each marker's, context edge's and the stop's pattern

    def of(self, pattern: re.Pattern[str]) -> frozenset[str]:
        return self.edges[pattern.pattern]


@dataclass(frozen=True)
class Rules:
    line: LineSyntax
    traceback: TracebackSyntax
    default_phase: str
    default_category: str
    category_by_phase: Mapping[str, str]
    markers: tuple[Marker, ...]
    contexts: tuple[Context, ...]
    idle: re.Pattern[str] | None
    stop: re.Pattern[str] | None
    hangs: tuple[HangRule, ...]
    frame_hints: tuple[FrameHint, ...]
    module_hints: tuple[FrameHint, ...]
    rules: tuple[ErrorRule, ...]
    hints: Mapping[str, str]
    secondary_oom_hint: str
    signature_replace: tuple[tuple[re.Pattern[str], str], ...]
    signature_max_chars: int
    # One alternation of every error rule: a single search rejects most lines before the ordered per-rule checks.
    rule_gate: re.Pattern[str]
    frame_gate: re.Pattern[str]
    context_frame_gate: re.Pattern[str]  # the contexts' frames
    scan: ScanSyntax | None  # None when some pattern has no literal: whole-file analysis reads every line
    # The rules marked `warned`: a line at a warning level that one names is read as an error line would be.
    warned_gate: re.Pattern[str] | None
    # Evidence of the phase in an error's own lines when no marker, frame or module places it ([defaults]).
    request_evidence: re.Pattern[str] | None = None
    serving_seq: int = 100
    # Traceback frames of an engine starting: a rule's usual phase places an error there ([defaults]).
    startup_frames: re.Pattern[str] | None = None
    # A worker method an error's own line names (group `method`), placed by the frame hints.
    method_named: re.Pattern[str] | None = None

    def category_hint(self, category: str) -> str:
        return self.hints.get(category, self.hints.get("other", ""))


def gate(patterns: Iterable[re.Pattern[str]], where: str = "gate") -> re.Pattern[str]:
    """One alternation of many patterns (named groups dropped), matching where any of them would;
    `re` caches compiled patterns, so rebuilding the same gate is cheap."""
    parts = [f"(?:{_NAMED_GROUP.sub('(?:', p.pattern)})" for p in patterns]
    try:
        return re.compile("|".join(parts) or r"(?!)")
    except re.error as exc:
        raise RulesError(f"{where}: the patterns do not compile as one alternation: {exc}") from None


def parse_rules(data: dict[str, Any], origin: str = "rules.toml") -> Rules:
    """Rules from the parsed TOML, read by the project's one typed reader: RulesError names the file, the row
    and the key."""
    try:
        return TomlReader(data, origin).strictly(_rules)
    except ConfigError as exc:
        raise RulesError(str(exc)) from None


def _rules(top: TomlReader) -> Rules:
    if (version := top.whole("version")) != 1:
        raise top.fail(f"unsupported version {version!r} (expected 1)")
    line = top.section("line").strictly(_line)
    traceback = top.section("traceback").strictly(_traceback)
    markers = tuple(row.strictly(_marker) for row in top.rows("marker", required=False))
    contexts = tuple(row.strictly(_context) for row in top.rows("context", required=False))
    stop = top.section("stop", required=False).strictly(_pattern)
    frame_hints = _frame_hints(top, "frame_hint")
    rules = _error_rules(top)
    hints = _hints(top)
    warned = [r.pattern for r in rules if r.warned]
    defaults = top.section("defaults")
    signature = top.section("signature")
    parsed = Rules(
        line=line,
        traceback=traceback,
        # "unknown": an error nothing in the log places is reported so, never with a guessed phase.
        default_phase=defaults.choice("phase", (*PHASES, UNKNOWN_PHASE)),
        default_category=defaults.choice("category", CATEGORIES),
        category_by_phase=defaults.text_table("category_by_phase", PHASES, CATEGORIES),
        markers=markers,
        contexts=contexts,
        idle=top.section("idle", required=False).strictly(_pattern),
        stop=stop,
        hangs=tuple(row.strictly(_hang) for row in top.rows("hang", required=False)),
        frame_hints=frame_hints,
        module_hints=_frame_hints(top, "module_hint"),
        rules=rules,
        hints=hints,
        secondary_oom_hint=hints.get("secondary_oom", ""),
        signature_replace=_replacements(signature),
        signature_max_chars=signature.whole("max_chars"),
        rule_gate=gate((r.pattern for r in rules), f"{top.origin} [[rule]]"),
        frame_gate=gate((h.pattern for h in frame_hints), f"{top.origin} [[frame_hint]]"),
        context_frame_gate=gate((c.frames for c in contexts if c.frames), f"{top.origin} [[context]] frames"),
        scan=_scan(line, traceback, markers, contexts, rules, stop),
        warned_gate=gate(warned, f"{top.origin} [[rule]] warned") if warned else None,
        request_evidence=defaults.optional_regex("request_evidence"),
        serving_seq=defaults.whole("serving_seq", 100),
        startup_frames=defaults.optional_regex("startup_frames"),
        method_named=defaults.optional_regex("method_named"),
    )
    for section in (defaults, signature):  # read above, key by key: what they did not ask for is a typo
        section.only(section.read)
    return parsed


def _line(line: TomlReader) -> LineSyntax:
    return LineSyntax(
        max_chars=line.whole("max_chars"),
        ansi=line.regex("ansi"),
        wrappers=tuple(line.regexes("wrappers")),
        process=line.regex("process"),
        suffixes=tuple(line.regexes("suffixes")),
        headers=tuple(line.regexes("headers")),
        error_levels=frozenset(line.texts("error_levels")),
        warning_levels=frozenset(line.texts("warning_levels")),
        code=line.regex("code"),
        quoted=line.optional_regex("quoted"),
        relogged=line.optional_regex("relogged"),
        joined=line.optional_regex("joined"),
    )


def _traceback(tb: TomlReader) -> TracebackSyntax:
    return TracebackSyntax(
        start=tb.regex("start"),
        chain=tb.regex("chain"),
        frame=tb.regex("frame"),
        exception=tb.regex("exception"),
        standalone=tb.regex("standalone"),
        max_message_lines=tb.whole("max_message_lines"),
        max_wait_lines=tb.whole("max_wait_lines"),
        header_wait_lines=tb.whole("header_wait_lines"),
        titled=tb.optional_regex("titled"),
    )


def _marker(row: TomlReader) -> Marker:
    return Marker(row.choice("phase", PHASES), row.regex("pattern"), row.flag("ready", False), row.flag("reset", False))


def _context(row: TomlReader) -> Context:
    return Context(
        row.text("name"),
        row.regex("start"),
        row.regex("end"),
        row.optional_choice("category", CATEGORIES),
        row.flag("secondary_oom", False),
        row.optional_regex("frames"),
    )


def _frame_hints(top: TomlReader, key: str) -> tuple[FrameHint, ...]:
    return tuple(row.strictly(_frame_hint) for row in top.rows(key, required=False))


def _frame_hint(row: TomlReader) -> FrameHint:
    return FrameHint(row.choice("phase", PHASES), row.regex("pattern"))


def _pattern(section: TomlReader) -> re.Pattern[str] | None:
    """[idle] and [stop]: one optional pattern."""
    return section.optional_regex("pattern")


def _hang(row: TomlReader) -> HangRule:
    return HangRule(row.choice("category", CATEGORIES), row.regex("pattern"), row.text("hint", ""))


def _error_rules(top: TomlReader) -> tuple[ErrorRule, ...]:
    rules = tuple(row.strictly(_rule) for row in top.rows("rule", required=False))
    ids = [r.id for r in rules]
    if duplicates := sorted({i for i in ids if ids.count(i) > 1}):
        raise top.fail(f"duplicate rule ids: {', '.join(duplicates)}")
    return rules


def _rule(row: TomlReader) -> ErrorRule:
    pattern = row.regex("pattern")
    hint = row.text("hint", "") or None
    for name in re.findall(r"\{(\w+)\}", hint or ""):
        if name not in pattern.groupindex:
            raise row.fail(f"'hint' names {{{name}}}, not a group of the pattern")
    kind: RuleKind = cast(RuleKind, row.choice("kind", _KINDS, "root"))
    return ErrorRule(
        id=row.text("id"),
        kind=kind,
        pattern=pattern,
        category=row.optional_choice("category", CATEGORIES),
        category_by_phase=row.text_table("category_by_phase", PHASES, CATEGORIES),
        phase=row.optional_choice("phase", PHASES),
        phase_fixed=row.flag("phase_fixed", False),
        secondary_oom=row.flag("secondary_oom", False),
        suppress_traceback=row.flag("suppress_traceback", False),
        hang=row.flag("hang", False),
        phase_usual=row.flag("phase_usual", False),
        startup=row.flag("startup", False),
        reaction=row.flag("reaction", False),
        hint=hint,
        examples=tuple(row.texts("examples")),
        cause_follows=row.optional_regex("cause_follows"),
        warned=row.flag("warned", False),
        phase_in_process={
            phase: row.compile(pattern, f"phase_in_process.{phase}")
            for phase, pattern in row.text_table("phase_in_process", PHASES).items()
        },
    )


def _hints(top: TomlReader) -> dict[str, str]:
    """A hint for every category (the one shown when the error's rule has none), and secondary_oom's."""
    hints = top.text_table("hints", keys=(*CATEGORIES, "secondary_oom"))
    if missing := [c for c in CATEGORIES if c not in hints]:
        raise top.fail(f"[hints]: no hint for categories: {', '.join(missing)}")
    return hints


def _replacements(signature: TomlReader) -> tuple[tuple[re.Pattern[str], str], ...]:
    """[signature] replace: [pattern, replacement] pairs applied to an error's line before it is compared."""
    pairs = signature.value("replace", [])
    if not isinstance(pairs, list):
        raise signature.fail(f"'replace' must be a list of [pattern, replacement], got {pairs!r}")
    out = []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise signature.fail(f"'replace'[{i}] must be [pattern, replacement], got {pair!r}")
        out.append((signature.compile(pair[0], f"replace[{i}]"), pair[1]))
    return tuple(out)


def _scan(
    syntax: LineSyntax,
    traceback: TracebackSyntax,
    markers: Iterable[Marker],
    contexts: Iterable[Context],
    rules: Iterable[ErrorRule],
    stop: re.Pattern[str] | None,
) -> ScanSyntax | None:
    """Needles of every pattern whose lines whole-file analysis must not jump over."""
    errors = needles_of([traceback.start, traceback.frame, traceback.standalone, *(r.pattern for r in rules)])
    oom = needles_of(r.pattern for r in rules if r.category == "oom")
    wrappers = needles_of(r.pattern for r in rules if r.kind == "wrapper")
    patterns = [m.pattern for m in markers] + [p for c in contexts for p in (c.start, c.end)]
    patterns += [stop] if stop is not None else []
    edges = {p.pattern: needles_of([p]) for p in patterns}
    if errors is None or oom is None or wrappers is None or any(n is None for n in edges.values()):
        return None
    return ScanSyntax(
        errors=errors | syntax.error_levels,
        oom=oom,
        wrappers=wrappers,
        edges={k: v for k, v in edges.items() if v is not None},
    )


def load_rules(path: str | Path) -> Rules:
    """Rules from a TOML file (a site's own rule set, or a test's)."""
    try:
        data = read_toml(Path(path))
    except ConfigError as exc:
        raise RulesError(str(exc)) from None
    return parse_rules(data, str(path))


@cache
def default_rules() -> Rules:
    """The shipped rules.toml, parsed once per process."""
    try:
        shipped = packaged("rules.toml", "kernel.analyzer")
    except ConfigError as exc:
        raise RulesError(str(exc)) from None
    return parse_rules(shipped.data, shipped.origin)
