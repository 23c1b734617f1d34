"""Literal needles of a regex: strings at least one of which occurs in any text the regex finds.

Whole-file analysis (runner.analyzer.scan) searches for them with Hyperscan to jump over lines that cannot
change the result. They are derived from the patterns themselves, so rules.toml stays the only knowledge
and a new rule cannot be forgotten: a pattern with no usable literal makes the derivation fail (None).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from typing import Any

# The regex engine's own parser (Python >= 3.11; not in typeshed): the needles follow its exact syntax.
_p: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

# Shorter needles match too much ordinary text to be worth searching for.
MIN_NEEDLE = 4
_Needles = frozenset[str]


def needles(pattern: re.Pattern[str]) -> _Needles | None:
    """Needles of a compiled pattern, or None when some match may contain no literal of MIN_NEEDLE chars."""
    return _sequence(_p.parse(pattern.pattern, pattern.flags), pattern.flags)


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
