"""Whole-file analysis that jumps over lines which cannot change the result.

Most of a big log is INFO, access and stats lines that no rule, marker or traceback cares about; reading
them one by one in Python is what makes streaming slow. Here the analyzer itself says what can still
matter (StreamAnalyzer.watch: literal needles derived from the patterns of rules.toml), Hyperscan finds
the next line with one of them at memory speed, and only that line is fed. Lines in between are counted,
so line numbers stay exact. Wherever a traceback, message or header is open every line is fed, as in
streaming; so the result is streaming's (tests/test_analyzer_scan.py checks this on the corpus and on
generated logs).

Hyperscan is optional (x86-64 wheels): without it, analyze_stream reads every line.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Iterator
from functools import lru_cache
from typing import BinaryIO, cast

from runner.analyzer.lines import LineParser, LogLine
from runner.analyzer.rules import LineSyntax, Rules
from runner.analyzer.stream import CONTEXT_BEFORE, ErrorFinding, StreamAnalyzer, Watch

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


def usable(stream: BinaryIO, rules: Rules) -> bool:
    """Whether analyze_file can read this stream: Hyperscan is installed, the rules have needles and the
    stream can seek (a file, not a pipe)."""
    return _HYPERSCAN and rules.scan is not None and stream.seekable() and hasattr(stream, "readinto")


class _Finder:
    """The first line with a needle, by Hyperscan."""

    def __init__(self) -> None:
        self._hit = -1

    def _stop(self, _id: int, _from: int, to: int, _flags: int, _context: object) -> bool:
        self._hit = to
        return True  # the first match is all we need: Hyperscan stops here

    def find(self, literals: frozenset[str], buf: bytearray, start: int, end: int) -> int:
        """Index of the last byte of the first needle in buf[start:end] (whole lines), or -1."""
        db = _database(literals)
        view = memoryview(buf)
        window = _WINDOW_BYTES
        while start < end:
            # In windows of whole lines, growing: a scan costs as much as the buffer it is given, even
            # when it stops at the first match.
            stop = buf.rfind(b"\n", start, min(end, start + window)) + 1 or buf.index(b"\n", start) + 1
            self._hit = -1
            try:
                db.scan(cast(bytes, view[start:stop]), match_event_handler=self._stop)
            except hyperscan.ScanTerminated:
                return start + self._hit - 1
            start = stop
            window = min(2 * window, _MAX_WINDOW_BYTES)
        return -1


@lru_cache(maxsize=64)
def _database(literals: frozenset[str]) -> hyperscan.Database:
    """One compiled database per needle set (a handful per log, a few ms each), kept for the process."""
    # A needle that contains another is redundant; fewer needles scan faster.
    kept = [n for n in literals if not any(m != n and m in n for m in literals)]
    expressions = [b"".join(b"\\x%02x" % c for c in n.encode()) for n in kept]
    db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
    db.compile(expressions=expressions, ids=list(range(len(expressions))), flags=[0] * len(expressions))
    return db


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


def analyze_file(stream: BinaryIO, rules: Rules) -> tuple[StreamAnalyzer, tuple[str, ...] | None]:
    """Analyze a seekable log from its current position: the closed analyzer, and the first error's
    context when it differs from what the analyzer saw (see _context)."""
    assert rules.scan is not None
    start = stream.tell()
    size = stream.seek(0, io.SEEK_END) - start
    stream.seek(start)
    analyzer = StreamAnalyzer(rules)
    finder = _Finder()
    max_chars = rules.line.max_chars
    long_line = 4 * max_chars + 4  # a decoded character takes at most 4 bytes
    fed: deque[tuple[int, int]] = deque(maxlen=_RECENT_FED)
    first_skipped = 0  # number of the first line jumped over (0: none yet)
    parser = LineParser(rules.line)
    for buf, end, offset in _blocks(stream, long_line, size):
        pos = 0
        while pos < end:
            watch = analyzer.watch()
            if watch is not None:
                # Jump to the next line with a needle; over it too when it cannot count after all.
                hit = -1 if watch.final else finder.find(watch.any_line | watch.error_line, buf, pos, end)
                line_start = end if hit < 0 else buf.rfind(b"\n", pos, hit) + 1 or pos
                read = hit >= 0 and _counts(buf, line_start, buf.index(b"\n", hit), watch, finder, parser, rules.line)
                target = line_start if read or hit < 0 else buf.index(b"\n", hit) + 1
                skipped = buf.count(b"\n", pos, target)
                if skipped and not first_skipped:
                    first_skipped = analyzer.lines + 1
                analyzer.skip(skipped)
                pos = target
                if not read:
                    continue
            newline = buf.index(b"\n", pos)
            analyzer.feed(_decode(buf, pos, newline, long_line, max_chars), 0.0)
            fed.append((analyzer.lines, offset + pos))
            pos = newline + 1
    analyzer.close()
    error = analyzer.first_error
    if error is None or not first_skipped or first_skipped > error.line_no:
        return analyzer, None
    at = dict(fed).get(error.line_no)
    if at is None:
        at = _offset_of(stream, start, error.line_no, long_line)
    return analyzer, _context(stream, start + at, analyzer, error, long_line)


def _decode(buf: bytearray, start: int, end: int, long_line: int, max_chars: int) -> str:
    """The line as streaming reads it (iter_lines): UTF-8 with replacement, cut at max_chars."""
    return buf[start : min(end, start + long_line)].decode("utf-8", errors="replace")[:max_chars]


def _counts(
    buf: bytearray, start: int, end: int, watch: Watch, finder: _Finder, parser: LineParser, syntax: LineSyntax
) -> bool:
    """Whether the line buf[start:end], which has a needle, must be read: it has a needle that counts in
    any line, or it is logged at an error level or not logged (an INFO line quoting an error does not)."""
    if watch.any_line and finder.find(watch.any_line, buf, start, end + 1) >= 0:
        return True
    level = parser.parse(_decode(buf, start, end, 4 * syntax.max_chars + 4, syntax.max_chars)).level
    return level is None or level in syntax.error_levels


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
