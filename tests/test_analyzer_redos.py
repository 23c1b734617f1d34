"""No regex of the analyzer backtracks super-linearly (issue 28): a log line is anyone's text, and the live
analyzer reads it inside the runner's event loop.

Every pattern of the loaded rule set (walked, not listed), the line parser's combinations, the gates and the
analyzer modules' own regexes run, as the analyzer runs them, on lines built from their own parts (what leads up
to each repetition, repeated or followed by a long run of what the repetition consumes; each literal repeated):
each must stay within a time budget and grow no faster than the line. The patterns issue 28 found are kept
here as they were, to show the shapes catch them. And a line of a MiB costs the analyzer a bounded time.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import pkgutil
import re
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType
from typing import Any

import pytest

import kernel.analyzer
from kernel.analyzer import StreamAnalyzer, default_rules
from kernel.analyzer.lines import LineParser
from kernel.analyzer.rules import Rules, gate
from kernel.analyzer.signature import normalize

_p: Any = importlib.import_module("re._parser")
_c: Any = importlib.import_module("re._constants")

RULES = default_rules()
# Longer than the longest line the analyzer reads (line.max_chars), so a pattern that is linear only
# because lines are cut would still show up here.
SIZE = 32 * 1024
# CPU seconds per pattern and input. A linear pattern takes under 10 ms on SIZE characters on a loaded
# 2-core machine; the backtracking this guards against took minutes.
BUDGET_S = 0.2

# The fields the analyzer only ever calls `.match` on (anchored at the start of the text it is given):
# searching them from every position is not what it runs, so only `match` is timed.
ANCHORED = (
    "line.wrappers",
    "line.process",
    "line.headers",
    "line.code",
    "line.quoted",
    "line.relogged",
    "traceback.",
    "parser._wrappers",
    "parser._quoted",
    "parser._relogged",
    "parser._headers",
)


def _walk(obj: Any, path: str) -> Iterator[tuple[str, re.Pattern[str]]]:
    if isinstance(obj, re.Pattern):
        yield path, obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = getattr(obj, "id", None) or getattr(obj, "name", None)
        where = f"{path}[{name}]" if isinstance(name, str) and path.endswith("]") else path
        where = re.sub(r"\[\d+\]\[", "[", where)
        for field in dataclasses.fields(obj):
            yield from _walk(getattr(obj, field.name), f"{where}.{field.name}")
    elif isinstance(obj, tuple | list):
        for i, item in enumerate(obj):
            yield from _walk(item, f"{path}[{i}]")
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from _walk(value, f"{path}[{key}]")


def engine_patterns(rules: Rules) -> dict[str, re.Pattern[str]]:
    """Every regex the analyzer runs on log text, by where it comes from: the loaded rule set (walked, not
    listed), the line parser's combinations and the analyzer modules' own regexes; not the gates (below)."""
    found = {path.removeprefix("rules."): p for path, p in _walk(rules, "rules") if not path.endswith("_gate")}
    parser = LineParser(rules.line)
    found |= {f"parser.{k}": v for k, v in vars(parser).items() if isinstance(v, re.Pattern)}
    for info in pkgutil.iter_modules(kernel.analyzer.__path__, "kernel.analyzer."):
        module = importlib.import_module(info.name)
        found |= {f"{info.name}.{k}": v for k, v in vars(module).items() if isinstance(v, re.Pattern)}
    return found


def gates(rules: Rules) -> dict[str, tuple[re.Pattern[str], list[re.Pattern[str]]]]:
    """The alternations that reject most lines with one search, with the patterns they combine (the
    analyzer's own gates combine subsets of these: the rules still in play, the markers still to see)."""
    quiet = [m.pattern for m in rules.markers] + [p for c in rules.contexts for p in (c.start, c.end)]
    quiet += [p for p in (rules.idle, rules.stop) if p is not None]
    parts = {
        "rule_gate": [r.pattern for r in rules.rules],
        "frame_gate": [h.pattern for h in rules.frame_hints],
        "context_frame_gate": [c.frames for c in rules.contexts if c.frames],
        "quiet gate": quiet,
    }
    return {name: (getattr(rules, name, None) or gate(found), found) for name, found in parts.items()}


PATTERNS = engine_patterns(RULES)
GATES = gates(RULES)


_CATEGORY_SAMPLES = {
    _c.CATEGORY_DIGIT: "7",
    _c.CATEGORY_NOT_DIGIT: "x",
    _c.CATEGORY_SPACE: " ",
    _c.CATEGORY_NOT_SPACE: "x",
    _c.CATEGORY_WORD: "a",
    _c.CATEGORY_NOT_WORD: "-",
}
_REPEATS = (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT)


def _chars(op: Any, av: Any) -> list[str] | None:
    """Characters one single-character item matches (a few samples), None for any other item."""
    if op is _c.LITERAL:
        return [chr(av)]
    if op in (_c.NOT_LITERAL, _c.ANY):
        return ["x"]
    if op is _c.CATEGORY:
        return [_CATEGORY_SAMPLES.get(av, "x")]
    if op is _c.IN:
        if any(o is _c.NEGATE for o, _ in av):
            return ["x"]
        out: list[str] = []
        for o, a in av:
            if o is _c.LITERAL:
                out.append(chr(a))
            elif o is _c.RANGE:
                out += [chr(a[0]), chr(a[1])]
            elif o is _c.CATEGORY:
                out.append(_CATEGORY_SAMPLES.get(a, "x"))
        return out or ["x"]
    return None


def _sample(items: Any) -> str:
    """A short text the parsed sequence matches (the first alternative, the fewest repetitions)."""
    out = []
    for op, av in items:
        if (chars := _chars(op, av)) is not None:
            out.append(chars[0])
        elif op is _c.SUBPATTERN:
            out.append(_sample(av[3]))
        elif op is _c.BRANCH:
            out.append(_sample(av[1][0]))
        elif op in _REPEATS:
            out.append(_sample(av[2]) * av[0])
        elif op is _c.ATOMIC_GROUP:
            out.append(_sample(av))
    return "".join(out)


def _seeds(items: Any, before: str, seeds: dict[str, set[str]]) -> None:
    """What leads up to each repetition of the pattern (`before` it), with what that repetition consumes:
    the prefix and the pump of the classic attack string; and each alternative's whole text but its last
    character (a match that fails at the very end)."""
    for i, (op, av) in enumerate(items):
        here = before + _sample(items[:i])
        if op in _REPEATS:
            if av[1] > 1:
                body = av[2]
                pumps = seeds.setdefault(here, set())
                pumps.add(_sample(body) or "x")
                if len(body) == 1 and (chars := _chars(*body[0])) is not None:
                    pumps.update(chars)
            _seeds(av[2], here, seeds)
        elif op is _c.SUBPATTERN:
            _seeds(av[3], here, seeds)
        elif op is _c.BRANCH:
            for branch in av[1]:
                _seeds(branch, here, seeds)
        elif op is _c.ATOMIC_GROUP:
            _seeds(av, here, seeds)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            _seeds(av[1], here, seeds)
    whole = before + _sample(items)
    if len(whole) > 1:
        seeds.setdefault(whole[:-1], set())


def adversarial(pattern: re.Pattern[str], size: int = SIZE) -> Iterator[tuple[str, str]]:
    """(shape, text) pairs of about `size` characters that come close to matching, built from the pattern's
    own parts: what leads up to a repetition, again and again or followed by a long run of what the
    repetition consumes; and each literal of the pattern again and again."""
    seeds: dict[str, set[str]] = {}
    parsed = _p.parse(pattern.pattern, pattern.flags)
    _seeds(parsed, "", seeds)
    literals: set[str] = set()
    _literals(parsed, literals)
    for lit in literals:
        seeds.setdefault(lit, set())
    for seed in sorted(seeds, key=lambda s: (-len(s), s)):
        if seed:
            for sep in ("", " "):
                yield f"({seed + sep!r})*", (seed + sep) * (size // (len(seed) + len(sep)) + 1)
        for pump in sorted(seeds[seed]):
            # Then a character that ends what was pumped without a match (`(?:a+)+$`).
            yield f"{seed!r}+{pump!r}*+'!'", seed + pump * (size // len(pump) + 1) + "!"


def _literals(items: Any, out: set[str]) -> None:
    """Every run of literal characters of the parsed pattern."""
    run: list[str] = []
    for op, av in items:
        if op is _c.LITERAL:
            run.append(chr(av))
            continue
        if run:
            out.add("".join(run))
            run.clear()
        if op is _c.SUBPATTERN:
            _literals(av[3], out)
        elif op is _c.BRANCH:
            for branch in av[1]:
                _literals(branch, out)
        elif op in _REPEATS:
            _literals(av[2], out)
        elif op is _c.ATOMIC_GROUP:
            _literals(av, out)
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            _literals(av[1], out)
    if run:
        out.add("".join(run))


class Slow(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Slow


def timed(call: Callable[[], object], budget_s: float) -> float:
    """The CPU seconds `call` took (other processes on a loaded machine do not count); Slow once it passes
    5 times budget_s of wall time (`re` checks for signals while it backtracks, so a runaway pattern is stopped
    instead of running for minutes)."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 5 * budget_s)
    start = time.thread_time()
    try:
        call()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return time.thread_time() - start


def _run(name: str, pattern: re.Pattern[str], text: str) -> Callable[[], object]:
    """The pattern run on `text` as the analyzer runs it."""
    if name.startswith(ANCHORED):
        return lambda: pattern.match(text)
    if name.startswith("signature_replace"):
        return lambda: pattern.sub("", text)
    return lambda: pattern.search(text)


def slow_inputs(name: str, pattern: re.Pattern[str], budget_s: float = BUDGET_S, first: bool = False) -> list[str]:
    """The shapes on which `pattern` took longer than budget_s, or grew faster than the text: 8 times the
    text may take 8 times as long (16 with noise, plus 3 ms), not the 64 times of a quadratic pattern."""
    slow = []
    small = dict(adversarial(pattern, SIZE // 8))
    for shape, text in adversarial(pattern):
        big, little = _run(name, pattern, text), _run(name, pattern, small[shape])
        try:
            # Three tries: a loaded machine can stall any one run. The smaller text first: a runaway pattern
            # is stopped sooner.
            if all(timed(big, budget_s) > min(budget_s, 16 * timed(little, budget_s) + 0.003) for _ in range(3)):
                raise Slow
        except Slow:
            slow.append(shape)
            if first:
                break
    return slow


def test_every_pattern_is_found() -> None:
    names = set(PATTERNS)
    assert {f"rules[{r.id}].pattern" for r in RULES.rules} <= names
    assert {"line.ansi", "traceback.standalone", "stop", "idle", "parser._headers"} <= names
    for prefix in ("markers", "contexts", "hangs", "frame_hints", "module_hints", "signature_replace"):
        assert any(name.startswith(prefix) for name in names), prefix


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_is_linear_on_adversarial_lines(name: str) -> None:
    assert slow_inputs(name, PATTERNS[name]) == []


@pytest.mark.parametrize("name", sorted(GATES))
def test_gate_is_the_alternation_of_tested_patterns(name: str) -> None:
    """A gate tries its alternatives one after the other at each position, none backtracking into another:
    it costs what its patterns cost, each tested above. Timed on each pattern's first shapes all the same."""
    combined, parts = GATES[name]
    assert combined.pattern == gate(parts).pattern
    assert all(any(part is p for p in PATTERNS.values()) for part in parts)
    slow = []
    for part in parts:
        for shape, text in itertools.islice(adversarial(part), 1):
            try:
                if timed(lambda text=text: combined.search(text), BUDGET_S) > BUDGET_S:
                    raise Slow
            except Slow:
                slow.append(shape)
    assert slow == []


# The patterns issue 28 found backtracking, as they were (rules.toml has the linear forms, matching the same
# lines), and the textbook case: the shapes must catch every one, or the test above proves nothing.
BACKTRACKING = [
    r"ptxas\S*.*returned non-zero exit status",
    r"\.so\S*: undefined symbol: ",
    r"lib(?:cuda|cudart|nvidia-ml)\S*\.so[.\d]*: cannot open shared object file",
    r"EngineCore\w* failed to start",
    r"gloo/transport/\S+\] Connection closed by peer",
    r'vllm/config/\S+", line \d+, in __post_init__',
    # Alone, `A .*B` costs little more than its linear form under the line cap; among a rule's other
    # alternatives, tried at every position, it is what the rule spent its time on.
    r"User-specified max_model_len .*greater than the derived max_model_len|Model architectures? .* (?:are|is) "
    r"not supported|failed to be inspected|was supported in vLLM until v|Failed to load the model config|requires "
    r"you to execute the (?:configuration|tokenizer|processor) file|: error: (?:unrecognized arguments|argument "
    r"|the following arguments are required|ambiguous option|invalid choice)|Error: --[\w-]+ requires --[\w-]+",
    r"Error executing method .* This might cause deadlock in distributed execution",
    r"Free memory on device .*? on startup is less than desired GPU memory utilization",
    r"Error with model error=ErrorInfo\(.*code=4\d\d\)",
    r"nvidia-container-runtime(?:-hook)?: .*(?:error|failed)",
    r"could not select device driver .*capabilities: \[\[gpu\]\]",
    r"\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\](?::\d+)?",
    r"(?:a+)+$",
]


@pytest.mark.parametrize("pattern", BACKTRACKING)
def test_the_shapes_catch_backtracking(pattern: str) -> None:
    assert slow_inputs("rules[probe].pattern", re.compile(pattern), budget_s=0.05, first=True)


def test_the_shapes_catch_backtracking_under_match() -> None:
    standalone = r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)\w*(?:\([\w.]*\))?:\s"
    assert slow_inputs("traceback.standalone", re.compile(standalone), budget_s=0.05, first=True)


def _huge(head: str, unit: str) -> str:
    return (head + unit * (MIB // len(unit) + 1))[:MIB]


# A line of a MiB reaches the analyzer (a progress bar, an MLIR dump, a log without newlines): it reads
# line.max_chars of it, so no line costs more than the worst line of that length.
MIB = 1 << 20
HUGE = [
    _huge("returned non-zero exit status ", "ptxas"),
    _huge('  File "/x/', "vllm/config/"),
    _huge("ValueError: ", "Error"),
    _huge("RuntimeError: [", ":"),
    _huge("ERROR 01-01 00:00:00 [core.py:1] ", "User-specified max_model_len "),
    _huge("(APIServer pid=1) ", "x"),
    _huge("", "Traceback (most recent call last): "),
]


@pytest.mark.parametrize("line", HUGE, ids=[line[:24] for line in HUGE])
def test_one_huge_line_costs_the_live_analyzer_a_bounded_time(line: str) -> None:
    def feed() -> None:
        analyzer = StreamAnalyzer(RULES)
        analyzer.feed("INFO 01-01 00:00:00 [x.py:1] vLLM API server version 0.9.1")
        analyzer.feed(line)
        analyzer.close()

    # About 20 ms on a loaded 2-core machine: the limit is the event loop's, a backtracking pattern takes seconds.
    assert min(timed(feed, 2.0) for _ in range(3)) < 0.1


@pytest.mark.parametrize("unit", ["EP ", "7.7.7.7:", "/a/b ", "[::"])
def test_a_signature_reads_a_bounded_text(unit: str) -> None:
    """The stages sign a server's error answer, whatever its length: the analyzer's own messages (a line and
    its cause line, each cut at line.max_chars) are signed whole, a longer text only as far."""
    longest = 2 * RULES.line.max_chars + 1
    message = _huge("", unit)
    assert normalize(RULES, message) == normalize(RULES, message[:longest])
    assert min(timed(lambda: normalize(RULES, message), 2.0) for _ in range(3)) < 0.1
    line = _huge("", unit)[: RULES.line.max_chars]
    assert normalize(RULES, f"{line} {line}") == _unbounded(f"{line} {line}")


def _unbounded(text: str) -> str:
    for pattern, replacement in RULES.signature_replace:
        text = pattern.sub(replacement, text)
    return text.strip()[: RULES.signature_max_chars]
