"""Whole-file analysis that jumps over lines which cannot change the result.

Most of a big log is INFO, access and stats lines that no rule, marker or traceback cares about; reading
them one by one in Python is what makes streaming slow. Here the analyzer itself says what can still
matter (StreamAnalyzer.watch: literal needles derived from the patterns of rules.toml), Hyperscan finds
the next line with one of them at memory speed, and only that line is fed. Lines in between are counted,
so line numbers stay exact. Wherever a traceback, message or header is open every line is fed, as in
streaming; so the result is streaming's (tests/test_analyzer_scan.py checks this on the corpus and on
generated logs).

A log where every third line says ERROR, Error or Exception (other components' error records, INFO lines
quoting exceptions) would stop the scan on every third line: before the first error, patterns with generic
needles are searched by their own regex (_Plan), and while a logged error line is held, later lines at an
error level are jumped over and read only as the header of a traceback (_header).

Hyperscan is optional (x86-64 wheels): without it, analyze_stream reads every line.
"""

from __future__ import annotations

import bisect
import hashlib
import io
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO, cast

from kernel.analyzer import disk_cache
from kernel.analyzer.lines import LineParser, LogLine
from kernel.analyzer.needles import needles, needles_of, superset_expression
from kernel.analyzer.rules import Rules
from kernel.analyzer.stream import CONTEXT_BEFORE, ErrorFinding, StreamAnalyzer, Watch

try:
    import hyperscan

    _HYPERSCAN = True
except ImportError:  # pragma: no cover - platforms without wheels
    _HYPERSCAN = False

CHUNK_BYTES = 8 << 20
_WINDOW_BYTES = 16 << 10
_MAX_WINDOW_BYTES = 1 << 20
# Lines fed last, by number, with their offsets: where the first error's context is re-read from.
_RECENT_FED = 4096
# How far before the first error its context (the lines of its stream before it) is looked for.
_CONTEXT_WINDOW = 1 << 20
# A pattern whose shortest needle is shorter is searched by its own pattern (needles.superset_expression): such
# needles (`Error`, `Error: `) are on every third line of a noisy log, the patterns' other parts are not.
_GENERIC_NEEDLE = 8
_NONE, _EARLIER = -1, -2  # _header: no line to read first; the traceback's process has no line earlier in the buffer


def usable(stream: BinaryIO, rules: Rules) -> bool:
    """Whether analyze_file can read this stream: Hyperscan is installed, the rules have needles and the
    stream can seek (a file; a pipe is spooled to one first, see whole_log)."""
    return available(rules) and stream.seekable() and hasattr(stream, "readinto")


def available(rules: Rules) -> bool:
    """Whether whole-file analysis can run at all: Hyperscan is installed and the rules have needles."""
    return _HYPERSCAN and rules.scan is not None


class _Restart(Exception):
    """A traceback whose header may be a line jumped over before lines that were read: analyze again without
    jumping over lines at an error level (rare: the header is almost always the line before)."""


@dataclass(frozen=True)
class _Plan:
    """What the scan searches for before the first error, derived from the rules: a pattern with generic
    needles (the exception-shaped line's `Error`, `Exception`, which a noisy log has on every third line) by
    its own pattern; while a logged error line is held, lines at an error level only where they name a frame
    (a later one matters only as the header of a traceback: see _header)."""

    errors: frozenset[str]  # needles of the other patterns, error levels
    held: frozenset[str] | None  # needles of the other patterns, frame hints (None: the hints have no needles)
    shaped: tuple[bytes, ...]  # Hyperscan expressions of the patterns with generic needles, and of coloured lines
    uncoloured: tuple[bytes, ...]  # the patterns' alone: for a buffer without an ANSI escape (they scan faster)


_PLANS: dict[int, tuple[Rules, _Plan | None]] = {}


def _plan(rules: Rules) -> _Plan | None:
    cached = _PLANS.get(id(rules))
    if cached is None or cached[0] is not rules:
        cached = _PLANS[id(rules)] = (rules, _derive(rules))
    return cached[1]


def _derive(rules: Rules) -> _Plan | None:
    tb = rules.traceback
    literals: set[str] = set()
    expressions: list[bytes] = []
    shapes: list[bytes] = []
    for pattern in (tb.standalone, tb.start, tb.frame, *(r.pattern for r in rules.rules)):
        found = needles(pattern)
        if found is None:
            return None
        shape = superset_expression(pattern) if min(map(len, found)) < _GENERIC_NEEDLE else None
        if shape is None:
            literals |= found
            continue
        # Searched by its own pattern; ANSI colour inside a word hides it from the pattern, so a coloured
        # line with one of its needles is still read.
        expressions.append(shape)
        shapes.append(shape)
        any_needle = b"(?:%s)" % b"|".join(_literal(n) for n in sorted(found))
        expressions.append(b"\\x1b[^\\n]*%s|%s[^\\n]*\\x1b" % (any_needle, any_needle))
    frames = needles_of([rules.frame_gate, rules.context_frame_gate])
    held = None if frames is None else frozenset(literals | frames)
    return _Plan(frozenset(literals | rules.line.error_levels), held, tuple(expressions), tuple(shapes))


_HEX = [b"\\x%02x" % c for c in range(256)]


def _literal(needle: str) -> bytes:
    """A needle as a Hyperscan expression: every byte escaped."""
    return b"".join(map(_HEX.__getitem__, needle.encode()))


class _Finder:
    """The first line with a needle, by Hyperscan. A database's matches in a stretch of the buffer are
    collected in one scan and kept: on an error-dense log the next line to read is often a few lines on, and
    a scan per line would cost more than the lines."""

    def __init__(self) -> None:
        self.literal = False  # whether the line find returned last has a needle (not only an expression's match)
        # id(database) -> (lo, hi, ends, literal ends): database scanned buf[lo:hi], where its matches there end
        # (one past their last byte) and where those of its needles do
        self._known: dict[int, tuple[int, int, list[int], list[int]]] = {}
        self._databases: dict[int, hyperscan.Database] = {}  # those known of, kept alive: their ids stay theirs
        self._ends: list[int] = []  # where the scan under way collects
        self._literal_ends: list[int] = []
        self._needles = False  # whether the database scanning has needles (else expressions)
        self._base = 0  # the buffer index the scanned view starts at
        self._was_literal = False

    def reset(self) -> None:
        """A new buffer: nothing is known of it."""
        self._known.clear()
        self._databases.clear()

    def _collect(self, id_: int, _from: int, to: int, _flags: int, _context: object) -> None:
        self._ends.append(self._base + to)
        if self._needles:
            self._literal_ends.append(self._base + to)

    def find(self, searches: tuple[_Search, ...], buf: bytearray, start: int, end: int) -> int:
        """Index of the last byte of the first match in buf[start:end] (whole lines), or -1."""
        window = _WINDOW_BYTES
        while start < end:
            # In windows of whole lines, growing; the databases go window by window together, so that
            # none scans far past another's match.
            stop = buf.rfind(b"\n", start, min(end, start + window)) + 1 or buf.index(b"\n", start) + 1
            first = line = -1
            for search in searches:
                hit = self._first(search, buf, start, stop)
                if hit < 0:
                    continue
                if first < 0 or hit < line:
                    first, line, self.literal = hit, buf.rfind(b"\n", start, hit) + 1, self._was_literal
                    stop = buf.index(b"\n", hit) + 1  # the next database looks only up to this match's line
                else:
                    self.literal |= self._was_literal  # another database's match in the same line
            if first >= 0:
                return first
            start = stop
            window = min(2 * window, _MAX_WINDOW_BYTES)
        return -1

    def _first(self, search: _Search, buf: bytearray, start: int, stop: int) -> int:
        """The first match of a database in buf[start:stop] (its last byte), or -1; _was_literal: whether a
        needle matched in that line. What is scanned is kept, and a scan runs ahead as far as the stretch
        already scanned is long: a few large scans, not one per line read."""
        db, needles = search
        lo, hi, ends, literal_ends = self._known.get(id(db), (-1, -1, [], []))
        if lo < 0 or lo > start or start > hi:
            lo, hi, ends, literal_ends = start, start, [], []
            self._known[id(db)] = (lo, hi, ends, literal_ends)
            self._databases[id(db)] = db
        if hi < stop:
            ahead = max(stop, buf.rfind(b"\n", hi, hi + min(hi - lo, _MAX_WINDOW_BYTES)) + 1)
            self._ends, self._literal_ends, self._needles, self._base = ends, literal_ends, needles, hi
            count = len(ends)
            db.scan(cast(bytes, memoryview(buf)[hi:ahead]), match_event_handler=self._collect)
            ends[count:] = sorted(ends[count:])  # each past the ones before; in order as Hyperscan reports them
            literal_ends.sort()
            self._known[id(db)] = (lo, ahead, ends, literal_ends)
        i = bisect.bisect_left(ends, start + 1)
        if i == len(ends) or ends[i] > stop:
            return -1
        hit = ends[i] - 1
        j = bisect.bisect_left(literal_ends, start + 1)
        self._was_literal = j < len(literal_ends) and literal_ends[j] <= buf.index(b"\n", hit) + 1
        return hit


_Search = tuple["hyperscan.Database", bool]  # the database, and whether its patterns are needles (else expressions)


@lru_cache(maxsize=64)
def _database(literals: frozenset[str], expressions: tuple[bytes, ...] = ()) -> tuple[_Search, ...]:
    """The databases of a search: its needles, and apart its expressions (which change less often: together
    they compile several times slower, once per watch the analyzer has)."""
    needles = ((_needle_database(literals), True),) if literals else ()
    return needles + (((_compiled(expressions), False),) if expressions else ())


@lru_cache(maxsize=64)
def _needle_database(literals: frozenset[str]) -> hyperscan.Database:
    """The needles' database, stored under the needles themselves: a stored one loads before the needles are
    pruned and escaped (a few hundred, ten milliseconds a watch)."""

    def patterns() -> tuple[bytes, ...]:
        # A needle that contains another is redundant; fewer needles scan faster.
        by_length = sorted(literals, key=lambda n: (len(n), n))
        return tuple(_literal(n) for i, n in enumerate(by_length) if not any(m in n for m in by_length[:i]))

    return _kept(("needles", tuple(sorted(literals))), patterns)


# What a stored database depends on besides its patterns: the bindings' version, the mode and flags, and how
# it is stored (kernel.analyzer.disk_cache: with a digest of its content and key).
_CACHE_FORMAT = ("hyperscan", getattr(hyperscan, "__version__", "") if _HYPERSCAN else "", "block", "flags 0", "digest")
_CACHE_FILES = 256  # the most databases kept on disk (a few MiB); the oldest go first


@lru_cache(maxsize=64)
def _compiled(patterns: tuple[bytes, ...]) -> hyperscan.Database:
    """One compiled database per set of patterns, kept for the process and on disk."""
    return _kept(("expressions", patterns), lambda: patterns)


def _kept(key: object, patterns: Callable[[], tuple[bytes, ...]]) -> hyperscan.Database:
    """The database stored under key (a repr-able value), or the one compiled from patterns() and stored:
    compiling a log's databases (20-40 of them, 5 ms each) was most of a short log's analysis; a stored one
    loads in microseconds. The file is named by the key's digest and its content checked against the key
    (disk_cache): a database stored for other patterns, or damaged, is compiled again."""
    derived_from = repr((_CACHE_FORMAT, key)).encode()
    path = disk_cache.cache_dir() / "hyperscan" / f"{hashlib.sha256(derived_from).hexdigest()}.hsdb"
    db = _stored(path, derived_from)
    if db is None:
        expressions = patterns()
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(expressions=list(expressions), ids=list(range(len(expressions))), flags=[0] * len(expressions))
        _store(path, derived_from, db)
    return db


def _stored(path: Path, key: bytes) -> hyperscan.Database | None:
    """The database stored at path under key, or None when there is none or it cannot be used (not to be
    trusted: see disk_cache; another Hyperscan version or CPU: Hyperscan checks its header)."""
    stored = disk_cache.load(path, key)
    if stored is None:
        return None
    try:
        db = hyperscan.loadb(stored, hyperscan.HS_MODE_BLOCK)
        db.scratch = hyperscan.Scratch(db)
    except hyperscan.error:
        return None
    return db


def _store(path: Path, key: bytes, db: hyperscan.Database) -> None:
    """Keep a compiled database for the next run (the oldest beyond _CACHE_FILES removed); silently nothing
    where the cache cannot be written (a read-only home, a full disk): the next run compiles again."""
    try:
        if disk_cache.store(path, key, hyperscan.dumpb(db)):
            kept = sorted(path.parent.glob("*.hsdb"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in kept[_CACHE_FILES:]:
                old.unlink(missing_ok=True)
    except (OSError, hyperscan.error):
        pass


def _blocks(stream: BinaryIO, long_line: int, size: int = CHUNK_BYTES) -> Iterator[tuple[bytearray, int, int]]:
    """(buffer, end, offset): buffer[:end] is whole lines, each ending with LF, read from the stream at
    offset. The last line gets an LF if it had none; a line longer than the buffer keeps only its first
    part (more than long_line bytes, more than any analysis reads) and one LF."""
    buf = bytearray(max(min(CHUNK_BYTES, size), 2 * long_line) + 1)
    view = memoryview(buf)
    offset = filled = 0
    discarding = False
    while True:
        count = cast(io.BufferedIOBase, stream).readinto(view[filled:-1])
        if discarding and count:
            newline = buf.find(b"\n", filled, filled + count)
            if newline < 0:
                offset += count
                continue
            discarding = False
            offset += newline + 1 - filled
            buf[filled : filled + count - newline - 1] = buf[newline + 1 : filled + count]
            count -= newline + 1 - filled
        filled += count
        if not filled:
            return
        end = buf.rfind(b"\n", 0, filled) + 1
        if not count or (not end and filled == len(buf) - 1):
            discarding = bool(count)
            buf[filled] = 0x0A
            end = filled = filled + 1
        if end:
            yield buf, end, offset
            offset += end - discarding  # an overlong line's LF is ours
            buf[: filled - end] = buf[end:filled]
            filled -= end


Progress = Callable[[int, "int | None"], None]  # (bytes done, bytes in all or None when not known yet)


def analyze_file(
    stream: BinaryIO, rules: Rules, *, progress: Progress | None = None, hold: bool = True
) -> tuple[StreamAnalyzer, tuple[str, ...] | None]:
    """Analyze a seekable log from its current position: the closed analyzer, and the first error's
    context when it differs from what the analyzer saw (see _context). `hold`: jump over lines at an error
    level while a logged error line is held (see _Plan); off, every line at an error level is read."""
    assert rules.scan is not None
    start = stream.tell()
    try:
        return _analyze(stream, start, rules, progress, hold)
    except _Restart:
        stream.seek(start)
        return _analyze(stream, start, rules, progress, False)


def _analyze(
    stream: BinaryIO, start: int, rules: Rules, progress: Progress | None, hold: bool
) -> tuple[StreamAnalyzer, tuple[str, ...] | None]:
    size = stream.seek(0, io.SEEK_END) - start
    stream.seek(start)
    analyzer = StreamAnalyzer(rules)
    plan = _plan(rules)
    errors = rules.scan.errors if rules.scan is not None else frozenset[str]()
    finder = _Finder()
    max_chars = rules.line.max_chars
    long_line = 4 * max_chars + 4  # a decoded character takes at most 4 bytes
    fed: deque[tuple[int, int]] = deque(maxlen=_RECENT_FED)
    first_skipped = 0  # number of the first line jumped over (0: none yet)
    held_from = -1  # offset of the first line jumped over while a logged error line was held (-1: none)
    parser = LineParser(rules.line)
    searches: dict[tuple[int, bool, bool], tuple[_Search, ...]] = {}
    held = plan.held if plan is not None else None
    starts = [n.encode() for n in needles(rules.traceback.start) or ()]  # of a line that starts a traceback

    def search(watch: Watch, holding: bool, coloured: bool) -> tuple[_Search, ...]:
        """The database for a watch (the analyzer keeps each Watch, so its id stays its own)."""
        db = searches.get((id(watch), holding, coloured))
        if db is None:
            literals, expressions = watch.any_line | watch.error_line, tuple[bytes, ...]()
            if plan is not None and watch.error_line is errors:
                chosen = held if holding and held is not None else plan.errors
                literals, expressions = watch.any_line | chosen, plan.shaped if coloured else plan.uncoloured
            db = searches[(id(watch), holding, coloured)] = _database(literals, expressions)
        return db

    for buf, end, offset in _blocks(stream, long_line, size):
        finder.reset()
        pos = 0
        fed_here: set[int] = set()  # where the lines read from this buffer start
        coloured = buf.find(b"\x1b", 0, end) >= 0  # (no line of a buffer without ESC is coloured)
        watch: Watch | None = None
        watched = False  # whether the line at pos was looked at by _header already
        fresh = False  # whether watch is still the analyzer's (nothing read since, before the first error)
        while pos < end:
            if not fresh:
                # (the log's first line is always read: an excerpt's first line may be the source line of the
                # outermost frame it cut, which places the traceback below it; see traceback._code_line)
                watch = analyzer.watch() if analyzer.lines else None
            fresh = False
            if watch is not None:
                holding = hold and held is not None and watch.error_line is errors and analyzer.holds_logged_error
                # Jump to the next line with a needle; over it too when it cannot count after all.
                hit = -1 if watch.final else finder.find(search(watch, holding, coloured), buf, pos, end)
                line_start = end if hit < 0 else buf.rfind(b"\n", pos, hit) + 1 or pos
                # A line only an expression found has none of the needles (the first database, which has
                # them, found nothing up to its end): no needle that counts in any line.
                any_line = bool(watch.any_line) and finder.literal
                read = hit >= 0 and _counts(
                    buf, line_start, buf.index(b"\n", hit), watch, any_line, finder, parser, rules
                )
                target = line_start if read or hit < 0 else buf.index(b"\n", hit) + 1
                if read and (holding or held_from >= 0) and analyzer.first_error is None:
                    header = _header(buf, pos, line_start, fed_here, parser, rules)
                    if header == _EARLIER and 0 <= held_from < offset:
                        raise _Restart  # its header may be a line jumped over in an earlier buffer
                    target = header if header >= 0 else target
                    watched = target == line_start
                skipped = buf.count(b"\n", pos, target)
                if skipped and not first_skipped:
                    first_skipped = analyzer.lines + 1
                if skipped and holding and held_from < 0:
                    held_from = offset + pos
                analyzer.skip(skipped)
                pos = target
                if not read:
                    # Only lines counted: the watch is the same (after the first error, how many lines
                    # followed it decides whether wrappers are still listed).
                    fresh = analyzer.first_error is None
                    continue
            newline = buf.index(b"\n", pos)
            # Lines at an error level were jumped over before: one of them may head a traceback that starts
            # here, where every line is read (a traceback or a message is open).
            if (
                held_from >= 0
                and not watched
                and analyzer.first_error is None
                and any(buf.find(n, pos, newline) >= 0 for n in starts)
                and _header(buf, pos, pos, fed_here, parser, rules) == _EARLIER
                and held_from < offset
            ):
                raise _Restart
            watched = False
            analyzer.feed(_decode(buf, pos, newline, long_line, max_chars), 0.0)
            fed.append((analyzer.lines, offset + pos))
            fed_here.add(pos)
            pos = newline + 1
        if progress is not None:
            progress(min(offset + end, size), size)  # a last line without LF got one
    analyzer.close()
    error = analyzer.first_error
    if error is None or not first_skipped or first_skipped > error.line_no:
        return analyzer, None
    at = dict(fed).get(error.line_no)
    if at is None:
        at = _offset_of(stream, start, error.line_no, long_line)
    return analyzer, _context(stream, start + at, analyzer, error, long_line)


def _header(buf: bytearray, pos: int, at: int, fed_here: set[int], parser: LineParser, rules: Rules) -> int:
    """Where the line that heads the traceback starting at buf[at] begins, when it was jumped over and must be
    read first; _NONE when none needs reading; _EARLIER when its process has no line earlier in the buffer
    (the caller judges the buffers before). _Restart when it was jumped over before lines that were read.

    While a logged error line is held, lines at an error level are jumped over: one matters only when the next
    line of its process starts a traceback in its stream (it then heads that traceback)."""
    syntax = rules.line
    long_line = 4 * syntax.max_chars + 4
    this = parser.parse(_decode(buf, at, buf.index(b"\n", at), long_line, syntax.max_chars))
    if not rules.traceback.start.match(this.msg):
        return _NONE
    while at > 0:
        before = buf.rfind(b"\n", 0, at - 1) + 1
        line = parser.parse(_decode(buf, before, at - 1, long_line, syntax.max_chars))
        if line.proc == this.proc:
            if before in fed_here or line.level not in syntax.error_levels or line.src != this.src:
                return _NONE
            if before >= pos:
                return before
            raise _Restart
        at = before
    return _EARLIER


def _decode(buf: bytearray, start: int, end: int, long_line: int, max_chars: int) -> str:
    """The line as streaming reads it (iter_lines): UTF-8 with replacement, cut at max_chars."""
    return buf[start : min(end, start + long_line)].decode("utf-8", errors="replace")[:max_chars]


def _counts(
    buf: bytearray,
    start: int,
    end: int,
    watch: Watch,
    any_line: bool,
    finder: _Finder,
    parser: LineParser,
    rules: Rules,
) -> bool:
    """Whether the line buf[start:end], which has a needle, must be read: it has a needle that counts in
    any line (looked for when any_line), or it is logged at an error level or not logged (an INFO line
    quoting an error does not), or it is a warning that a `warned` rule names."""
    if any_line and finder.find(_database(watch.any_line), buf, start, end + 1) >= 0:
        return True
    syntax = rules.line
    line = parser.parse(_decode(buf, start, end, 4 * syntax.max_chars + 4, syntax.max_chars))
    if line.level is None or line.level in syntax.error_levels:
        return True
    warned = rules.warned_gate
    return line.level in syntax.warning_levels and warned is not None and warned.search(line.msg) is not None


def _offset_of(stream: BinaryIO, start: int, line_no: int, long_line: int) -> int:
    """Offset of a line from start, by counting lines again (an error chosen only at the end of the log)."""
    stream.seek(start)
    seen = 0
    for buf, end, offset in _blocks(stream, long_line):
        count = buf.count(b"\n", 0, end)
        if seen + count >= line_no:
            pos = 0
            for _ in range(line_no - 1 - seen):
                pos = buf.index(b"\n", pos) + 1
            return offset + pos
        seen += count
    raise ValueError(f"no line {line_no}")


def _context(
    stream: BinaryIO, at: int, analyzer: StreamAnalyzer, error: ErrorFinding, long_line: int
) -> tuple[str, ...]:
    """The error's context with the lines of its stream before it read again: streaming kept the last
    few lines of every stream, also those this scan jumped over (looked for up to _CONTEXT_WINDOW back)."""
    parser = LineParser(analyzer.rules.line)
    max_chars = analyzer.rules.line.max_chars

    def parse(raw: bytes) -> LogLine:
        return parser.parse(raw[:long_line].decode("utf-8", errors="replace")[:max_chars])

    window = max(0, at - _CONTEXT_WINDOW)
    stream.seek(window)
    lines = stream.read(at - window).split(b"\n")[int(window > 0) : -1]  # the first may be partial
    this = parse(stream.readline(long_line).rstrip(b"\n"))
    before: list[str] = []
    for raw in reversed(lines):
        line = parse(raw)
        if (line.proc, line.src) == (this.proc, this.src):
            before.insert(0, line.display)
            if len(before) == CONTEXT_BEFORE:
                break
    emitted = analyzer._emitted
    assert emitted is not None
    return (*before, *error.context[len(emitted.before) :])
