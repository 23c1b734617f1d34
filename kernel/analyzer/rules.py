"""Loading rules.toml: the analyzer's knowledge as data, checked against the shared vocabulary.

Every regex is compiled here, once, and every phase or category id is checked against protos.vocab, so
a typo in the data fails at load time with the rule's id instead of misclassifying logs later.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from kernel.analyzer.needles import needles_of
from protos.vocab import CATEGORIES, PHASES, UNKNOWN_PHASE

RuleKind = Literal["root", "wrapper", "benign", "weak"]
_KINDS: tuple[RuleKind, ...] = ("root", "wrapper", "benign", "weak")
_NAMED_GROUP = re.compile(r"\(\?P<\w+>")


class RulesError(ValueError):
    """rules.toml cannot be used; the message names the entry and the key."""


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
    hint: str | None
    examples: tuple[str, ...]
    # A continuation line of the message that names the cause (pydantic's `Value error, ...`): it joins the
    # signature, so that two errors of one class with different causes do not compare equal.
    cause_follows: re.Pattern[str] | None = None
    # A root cause vLLM logs as a warning and runs on from (its libraries failing to load): the first error
    # when a later error follows it, nothing in a log where none does.
    warned: bool = False


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


class _Table:
    """Typed access to one TOML table; errors name the entry."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def _get(self, key: str, kinds: tuple[type, ...], what: str, default: Any) -> Any:
        if key not in self.data:
            if default is _REQUIRED:
                raise RulesError(f"{self.where}: missing {key!r}")
            return default
        value = self.data[key]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise RulesError(f"{self.where}: {key!r} must be {what}, got {value!r}")
        return value

    def text(self, key: str, default: Any = None) -> Any:
        return self._get(key, (str,), "a string", _REQUIRED if default is None else default)

    def optional_text(self, key: str) -> str | None:
        value: str | None = self._get(key, (str,), "a string", None)
        return value

    def integer(self, key: str) -> int:
        value: int = self._get(key, (int,), "an integer", _REQUIRED)
        return value

    def flag(self, key: str) -> bool:
        value: bool = self._get(key, (bool,), "true or false", False)
        return value

    def texts(self, key: str) -> list[str]:
        values = self._get(key, (list,), "a list of strings", [])
        if not all(isinstance(v, str) for v in values):
            raise RulesError(f"{self.where}: {key!r} must be a list of strings")
        return list(values)

    def mapping_of_texts(self) -> dict[str, str]:
        if not all(isinstance(v, str) for v in self.data.values()):
            raise RulesError(f"{self.where}: every value must be a string")
        return dict(self.data)

    def mapping(self, key: str) -> dict[str, str]:
        value = self._get(key, (dict,), "a table of strings", {})
        if not all(isinstance(v, str) for v in value.values()):
            raise RulesError(f"{self.where}: {key!r} must be a table of strings")
        return dict(value)

    def items(self, key: str) -> list[Any]:
        values: list[Any] = self._get(key, (list,), "a list", [])
        return values

    def tables(self, key: str) -> list[_Table]:
        values = self._get(key, (list,), "an array of tables", [])
        if not all(isinstance(v, dict) for v in values):
            raise RulesError(f"{self.where}: {key!r} must be an array of tables")
        return [_Table(v, f"{key}[{i}]") for i, v in enumerate(values)]

    def table(self, key: str) -> _Table:
        return _Table(self._get(key, (dict,), "a table", {}), key)

    def regex(self, key: str) -> re.Pattern[str]:
        return _compile(self.text(key), f"{self.where}.{key}")

    def phase(self, key: str) -> str | None:
        return _check_id(self.optional_text(key), PHASES, "phase", f"{self.where}.{key}")

    def category(self, key: str) -> str | None:
        return _check_id(self.optional_text(key), CATEGORIES, "category", f"{self.where}.{key}")


_REQUIRED = object()


def _check_id(value: str | None, allowed: Iterable[str], what: str, where: str) -> str | None:
    if value is not None and value not in allowed:
        raise RulesError(f"{where}: unknown {what} {value!r}; expected one of: {', '.join(allowed)}")
    return value


def _compile(pattern: str, where: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise RulesError(f"{where}: bad regex {pattern!r}: {exc}") from None


def gate(patterns: Iterable[re.Pattern[str]], where: str = "gate") -> re.Pattern[str]:
    """One alternation of many patterns (named groups dropped), matching where any of them would;
    `re` caches compiled patterns, so rebuilding the same gate is cheap."""
    parts = [f"(?:{_NAMED_GROUP.sub('(?:', p.pattern)})" for p in patterns]
    return _compile("|".join(parts) or r"(?!)", where)


def _required_phase(table: _Table, key: str) -> str:
    phase = _check_id(table.text(key), PHASES, "phase", f"{table.where}.{key}")
    assert phase is not None
    return phase


def _required_category(table: _Table, key: str) -> str:
    category = _check_id(table.text(key), CATEGORIES, "category", f"{table.where}.{key}")
    assert category is not None
    return category


def _phase_map(table: _Table, key: str) -> dict[str, str]:
    mapping = table.mapping(key)
    for phase, category in mapping.items():
        _check_id(phase, PHASES, "phase", f"{table.where}.{key}")
        _check_id(category, CATEGORIES, "category", f"{table.where}.{key}.{phase}")
    return mapping


def parse_rules(data: Mapping[str, Any], origin: str = "rules.toml") -> Rules:
    """Rules from the parsed TOML; RulesError names the offending entry."""
    top = _Table(data, origin)
    if top.integer("version") != 1:
        raise RulesError(f"{origin}: unsupported version {data['version']!r} (expected 1)")
    line = top.table("line")
    syntax = LineSyntax(
        max_chars=line.integer("max_chars"),
        ansi=line.regex("ansi"),
        wrappers=tuple(_compile(p, "line.wrappers") for p in line.texts("wrappers")),
        process=line.regex("process"),
        suffixes=tuple(_compile(p, "line.suffixes") for p in line.texts("suffixes")),
        headers=tuple(_compile(p, "line.headers") for p in line.texts("headers")),
        error_levels=frozenset(line.texts("error_levels")),
        warning_levels=frozenset(line.texts("warning_levels")) if "warning_levels" in line.data else frozenset(),
        code=line.regex("code"),
        quoted=line.regex("quoted") if "quoted" in line.data else None,
        relogged=line.regex("relogged") if "relogged" in line.data else None,
        joined=line.regex("joined") if "joined" in line.data else None,
    )
    tb = top.table("traceback")
    traceback = TracebackSyntax(
        start=tb.regex("start"),
        chain=tb.regex("chain"),
        frame=tb.regex("frame"),
        exception=tb.regex("exception"),
        standalone=tb.regex("standalone"),
        max_message_lines=tb.integer("max_message_lines"),
        max_wait_lines=tb.integer("max_wait_lines"),
        header_wait_lines=tb.integer("header_wait_lines"),
        titled=tb.regex("titled") if "titled" in tb.data else None,
    )
    defaults = top.table("defaults")
    markers = tuple(
        Marker(_required_phase(m, "phase"), m.regex("pattern"), m.flag("ready"), m.flag("reset"))
        for m in top.tables("marker")
    )
    contexts = tuple(
        Context(
            c.text("name"),
            c.regex("start"),
            c.regex("end"),
            c.category("category"),
            c.flag("secondary_oom"),
            c.regex("frames") if "frames" in c.data else None,
        )
        for c in top.tables("context")
    )
    idle_table = top.table("idle")
    idle = idle_table.regex("pattern") if "pattern" in idle_table.data else None
    stop_table = top.table("stop")
    stop = stop_table.regex("pattern") if "pattern" in stop_table.data else None
    frame_hints = tuple(FrameHint(_required_phase(h, "phase"), h.regex("pattern")) for h in top.tables("frame_hint"))
    module_hints = tuple(FrameHint(_required_phase(h, "phase"), h.regex("pattern")) for h in top.tables("module_hint"))
    hangs = tuple(
        HangRule(_required_category(h, "category"), h.regex("pattern"), h.optional_text("hint") or "")
        for h in top.tables("hang")
    )
    rules = tuple(_rule(r) for r in top.tables("rule"))
    ids = [r.id for r in rules]
    if duplicates := sorted({i for i in ids if ids.count(i) > 1}):
        raise RulesError(f"{origin}: duplicate rule ids: {', '.join(duplicates)}")
    hints = top.table("hints").mapping_of_texts()
    for key in hints:
        if key != "secondary_oom":
            _check_id(key, CATEGORIES, "category", f"hints.{key}")
    missing = [c for c in CATEGORIES if c not in hints]
    if missing:
        raise RulesError(f"hints: no hint for categories: {', '.join(missing)}")
    scan = _scan(syntax, traceback, markers, contexts, rules, stop)
    sig = top.table("signature")
    replacements: list[tuple[re.Pattern[str], str]] = []
    for i, pair in enumerate(sig.items("replace")):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise RulesError(f"signature.replace[{i}]: must be [pattern, replacement]")
        replacements.append((_compile(pair[0], f"signature.replace[{i}]"), pair[1]))
    return Rules(
        line=syntax,
        traceback=traceback,
        # "unknown": an error nothing in the log places is reported so, never with a guessed phase.
        default_phase=(
            UNKNOWN_PHASE if defaults.text("phase") == UNKNOWN_PHASE else _required_phase(defaults, "phase")
        ),
        default_category=_check_id(defaults.text("category"), CATEGORIES, "category", "defaults.category") or "",
        category_by_phase=_phase_map(defaults, "category_by_phase"),
        markers=markers,
        contexts=contexts,
        idle=idle,
        stop=stop,
        hangs=hangs,
        frame_hints=frame_hints,
        module_hints=module_hints,
        rules=rules,
        hints=hints,
        secondary_oom_hint=hints.get("secondary_oom", ""),
        signature_replace=tuple(replacements),
        signature_max_chars=sig.integer("max_chars"),
        rule_gate=gate((r.pattern for r in rules), "rule gate"),
        frame_gate=gate((h.pattern for h in frame_hints), "frame gate"),
        context_frame_gate=gate((c.frames for c in contexts if c.frames), "context frame gate"),
        scan=scan,
        warned_gate=gate((r.pattern for r in rules if r.warned), "warned gate")
        if any(r.warned for r in rules)
        else None,
        request_evidence=(
            _compile(defaults.text("request_evidence"), "defaults.request_evidence")
            if "request_evidence" in defaults.data
            else None
        ),
        serving_seq=defaults.integer("serving_seq") if "serving_seq" in defaults.data else 100,
        startup_frames=defaults.regex("startup_frames") if "startup_frames" in defaults.data else None,
        method_named=defaults.regex("method_named") if "method_named" in defaults.data else None,
    )


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


def _rule(table: _Table) -> ErrorRule:
    rule_id = table.text("id")
    table.where = f"rule {rule_id!r}"
    kind = table.text("kind", "root")
    if kind not in _KINDS:
        raise RulesError(f"{table.where}: kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    pattern = table.regex("pattern")
    hint = table.optional_text("hint")
    if hint is not None:
        for name in re.findall(r"\{(\w+)\}", hint):
            if name not in pattern.groupindex:
                raise RulesError(f"{table.where}: hint names {{{name}}}, not a group of the pattern")
    return ErrorRule(
        id=rule_id,
        kind=kind,
        pattern=pattern,
        category=table.category("category"),
        category_by_phase=_phase_map(table, "category_by_phase"),
        phase=table.phase("phase"),
        phase_fixed=table.flag("phase_fixed"),
        secondary_oom=table.flag("secondary_oom"),
        suppress_traceback=table.flag("suppress_traceback"),
        hang=table.flag("hang"),
        phase_usual=table.flag("phase_usual"),
        startup=table.flag("startup"),
        hint=hint,
        examples=tuple(table.texts("examples")),
        cause_follows=table.regex("cause_follows") if "cause_follows" in table.data else None,
        warned=table.flag("warned"),
    )


def load_rules(path: str | Path) -> Rules:
    """Rules from a TOML file (a site's own rule set, or a test's)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise RulesError(f"{path}: {exc}") from None
    return parse_rules(data, str(path))


@cache
def default_rules() -> Rules:
    """The shipped rules.toml, parsed once per process."""
    text = resources.files("kernel.analyzer").joinpath("rules.toml").read_text(encoding="utf-8")
    return parse_rules(tomllib.loads(text))
