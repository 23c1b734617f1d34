"""Literal needles of a regex: strings at least one of which occurs in any text the regex finds.

Whole-file analysis (kernel.analyzer.scan) searches for them with Hyperscan to jump over lines that cannot
change the result. They are derived from the patterns themselves, so rules.toml stays the only knowledge
and a new rule cannot be forgotten: a pattern with no usable literal makes the derivation fail (None).
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import json
import re
import sys
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from kernel.analyzer import disk_cache

# The regex engine's own parser (Python >= 3.11; not in typeshed): the needles follow its exact syntax.
_p: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

# Shorter needles match too much ordinary text to be worth searching for.
MIN_NEEDLE = 4
# A double quote in a line a collector re-logs as a quoted value (logfmt `msg="  File \"…\""`, rules.toml [line]
# quoted) is escaped: needles never hold one, and a pattern's quote widens to an optionally escaped one.
_QUOTE = ord('"')
_Needles = frozenset[str]


def needles(pattern: re.Pattern[str]) -> _Needles | None:
    """Needles of a compiled pattern, or None when some match may contain no literal of MIN_NEEDLE chars."""
    return _needles(pattern.pattern, pattern.flags)


@lru_cache(maxsize=1024)
def _needles(pattern: str, flags: int) -> _Needles | None:
    """Kept per pattern: the rules and the scan ask for the same patterns' needles (parsing them is slow), and
    on disk between runs (_Derived)."""
    found = _DERIVED.get(f"n{flags}:{pattern}", lambda: _sequence(_p.parse(pattern, flags), flags), sorted)
    return None if found is None else frozenset(found)


_V = TypeVar("_V")


class _Derived:
    """Needles and superset expressions of the patterns seen before, in one JSON file read once and written at
    exit when something was added: deriving them parses every pattern of the rules again (40 ms a process).
    The file is named by this module's source and Python's version (whose regex parser they follow), so a
    change to either starts a new one; silently nothing where the cache cannot be read or written."""

    _MAX = 8192  # entries written back (tests derive thousands of patterns of their own)

    def __init__(self) -> None:
        self._values: dict[str, Any] | None = None
        self._added = False

    def _path(self) -> tuple[Path, bytes]:
        """The file, and the key its content is stored under: this module's source and Python's version."""
        source = hashlib.sha256(Path(__file__).read_bytes() + sys.version.encode()).hexdigest()
        return disk_cache.cache_dir() / f"needles-{source[:16]}.json", source.encode()

    def get(self, key: str, derive: Callable[[], _V | None], to_json: Callable[[_V], Any]) -> Any:
        """The stored value of key (JSON: a list or a string, or None), else derive() stored as to_json gives it."""
        if self._values is None:
            try:
                stored = disk_cache.load(*self._path())
                loaded = None if stored is None else json.loads(stored)
            except (OSError, ValueError):
                loaded = None
            self._values = loaded if isinstance(loaded, dict) else {}
        if key in self._values:
            return self._values[key]
        derived = derive()
        value = None if derived is None else to_json(derived)
        if len(self._values) < self._MAX:
            self._values[key] = value
            if not self._added:
                self._added = True
                atexit.register(self.write)
        return value

    def write(self) -> None:
        """Store the values (this version's file replaced whole; the other versions' files removed)."""
        if not self._added or self._values is None:
            return
        try:
            path, source = self._path()  # (this module's source may be unreadable: an installation without it)
            if disk_cache.store(path, source, json.dumps(self._values).encode()):
                for old in path.parent.glob("needles-*.json"):
                    if old != path:
                        old.unlink(missing_ok=True)
        except OSError:
            pass
        self._added = False


_DERIVED = _Derived()


def needles_of(patterns: Iterable[re.Pattern[str]]) -> _Needles | None:
    """Needles of an alternation of patterns: the union, None if any pattern has none."""
    out: set[str] = set()
    for pattern in patterns:
        found = needles(pattern)
        if found is None:
            return None
        out |= found
    return frozenset(out)


def _better(a: _Needles | None, b: _Needles | None) -> _Needles | None:
    """The more selective of two needle sets: longer shortest needle, then fewer alternatives. Hyperscan
    searches many literals about as fast as one; what costs is a short needle found in lines that do not
    match (`Capturing ` in every CUDA-graph progress line, where only `Capturing CUDA graphs` counts)."""
    if a is None or b is None:
        return a if b is None else b
    return min(a, b, key=lambda s: (-min(map(len, s)), len(s)))


def _sequence(items: Any, flags: int) -> _Needles | None:
    best: _Needles | None = None
    run: list[str] = []

    def flush() -> None:
        nonlocal best
        if len(run) >= MIN_NEEDLE:
            best = _better(best, frozenset({"".join(run)}))
        run.clear()

    for op, av in items:
        if op is _c.LITERAL and av == _QUOTE:
            flush()  # (a collector may escape it: no needle holds a quote)
            continue
        if op is _c.LITERAL and not flags & re.IGNORECASE:
            run.append(chr(av))
            continue
        head = "".join(run)
        flush()
        if op is _c.SUBPATTERN:
            _group, add, remove, sub = av
            best = _better(best, _sequence(sub, (flags | add) & ~remove))
        elif op is _c.BRANCH:
            alternatives = [_sequence(branch, flags) for branch in av[1]]
            if all(a is not None for a in alternatives):
                best = _better(best, frozenset().union(*(a for a in alternatives if a is not None)))
            # `re` moves a common prefix out of a branch (`Error|Exception` is `E(?:rror|xception)`):
            # the literal before the branch continues into each alternative's own leading literal.
            joined = frozenset(head + _lead(branch, flags) for branch in av[1])
            if min(map(len, joined)) >= MIN_NEEDLE:
                best = _better(best, joined)
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT) and av[0] >= 1:
            best = _better(best, _sequence(av[2], flags))
        elif op is _c.ATOMIC_GROUP:
            best = _better(best, _sequence(av, flags))
    flush()
    return best


def _lead(items: Any, flags: int) -> str:
    """The literal an alternative starts with ('' if none)."""
    lead = []
    for op, av in items:
        if op is not _c.LITERAL or flags & re.IGNORECASE:
            break
        lead.append(chr(av))
    return "".join(lead)


def superset_expression(pattern: re.Pattern[str]) -> bytes | None:
    """A Hyperscan expression over a raw UTF-8 line that matches wherever the pattern could match the line's
    text (anchors, lookarounds and atomicity dropped; a non-ASCII character as one or more bytes >= 0x80), or
    None for what it cannot widen (case-insensitivity, conditionals, an expression that matches nothing or
    every line). Where generic needles (`Error`, `Exception`) match too many lines of a noisy log, the pattern
    itself is searched: the scan then stops only on lines the pattern may really match."""
    if pattern.flags & re.IGNORECASE:
        return None
    found = _DERIVED.get(
        f"s{pattern.flags}:{pattern.pattern}", lambda: _superset(pattern), lambda e: e.decode("latin-1")
    )
    return None if found is None else str(found).encode("latin-1")


def _superset(pattern: re.Pattern[str]) -> bytes | None:
    try:
        out = _widen(_p.parse(pattern.pattern, pattern.flags), pattern.flags)
    except _Unsupported:
        return None
    if out is None or re.fullmatch(out.decode("latin-1"), "") is not None:
        return None
    return out


class _Unsupported(Exception):
    pass


_NON_ASCII = b"[\\x80-\\xff]+"  # one character of UTF-8 (or a replacement for invalid bytes): 1 to 4 bytes
_CATEGORIES = {
    _c.CATEGORY_DIGIT: r"\d",
    _c.CATEGORY_NOT_DIGIT: r"\D",
    _c.CATEGORY_SPACE: r"\s",
    _c.CATEGORY_NOT_SPACE: r"\S",
    _c.CATEGORY_WORD: r"\w",
    _c.CATEGORY_NOT_WORD: r"\W",
}


_Char = tuple[set[int], bool]  # one character: its ASCII members (never LF), whether non-ASCII ones match


def _render(char: _Char, repeat: bytes = b"") -> bytes:
    """One character, or a repeat of it: a non-ASCII character is one or more bytes >= 0x80, so a repeat
    takes them into its class (`[ab\x80-\xff]{1,}`) and the expression stays simple to compile."""
    members, non_ascii = char
    members = members - {0x0A}  # a match stays in its line
    if not members and not non_ascii:
        raise _Unsupported
    ascii_part = b"".join(b"\\x%02x" % c for c in sorted(members))
    if repeat:
        low = repeat[1 : repeat.index(b",")]
        bound = b"{%s,}" % low if non_ascii else repeat
        return b"[" + ascii_part + (b"\\x80-\\xff" if non_ascii else b"") + b"]" + bound
    if not non_ascii:
        return b"[" + ascii_part + b"]"
    return b"(?:[" + ascii_part + b"]|" + _NON_ASCII + b")" if members else _NON_ASCII


def _single(op: Any, av: Any, flags: int) -> _Char | None:
    """The node as one character, or None when it is not one."""
    if op is _c.LITERAL:
        return ({av}, False) if av < 128 else (set(), True)
    if op is _c.NOT_LITERAL:
        return set(range(128)) - {av}, True
    if op is _c.ANY:
        return set(range(128)), True
    if op is _c.IN:
        return _class(av, flags)
    return None


def _class(items: Any, flags: int) -> _Char:
    negate = any(op is _c.NEGATE for op, _ in items)
    members: set[int] = set()
    non_ascii = negate
    for op, av in items:
        if op is _c.LITERAL:
            members |= {av} if av < 128 else set()
            non_ascii |= av >= 128
        elif op is _c.RANGE:
            members |= set(range(av[0], min(av[1], 127) + 1))
            non_ascii |= av[1] >= 128
        elif op is _c.CATEGORY:
            category = re.compile(_CATEGORIES[av], flags & re.ASCII)
            members |= {c for c in range(128) if category.match(chr(c))}
            non_ascii |= not flags & re.ASCII or av in (_c.CATEGORY_NOT_DIGIT, _c.CATEGORY_NOT_SPACE)
        elif op is not _c.NEGATE:
            raise _Unsupported
    if negate:
        members = set(range(128)) - members
    return members, non_ascii


def _widen(items: Any, flags: int) -> bytes:
    out = []
    for op, av in items:
        char = _single(op, av, flags)
        if op is _c.LITERAL and av == _QUOTE:
            out.append(b"\\x5c?\\x22")
        elif char is not None:
            out.append(_render(char))
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            low, high, sub = av
            bound = b"{%d,}" % low if high is _c.MAXREPEAT else b"{%d,%d}" % (low, high)
            inner = _single(sub[0][0], sub[0][1], flags) if len(sub) == 1 else None
            out.append(_render(inner, bound) if inner is not None else b"(?:" + _widen(sub, flags) + b")" + bound)
        elif op is _c.SUBPATTERN:
            _group, add, remove, sub = av
            if add & re.IGNORECASE:
                raise _Unsupported
            out.append(b"(?:" + _widen(sub, (flags | add) & ~remove) + b")")
        elif op is _c.ATOMIC_GROUP:
            out.append(b"(?:" + _widen(av, flags) + b")")
        elif op is _c.BRANCH:
            out.append(b"(?:" + b"|".join(_widen(branch, flags) for branch in av[1]) + b")")
        elif op is _c.GROUPREF:
            out.append(b"[^\\n]*")
        elif op not in (_c.AT, _c.ASSERT, _c.ASSERT_NOT):
            raise _Unsupported  # a conditional group or an engine-specific construct
    return b"".join(out)
