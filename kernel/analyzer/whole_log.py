"""Whole-log analysis: the same streaming logic over a text or a file, and its JSON and text forms."""

from __future__ import annotations

import gzip
import io
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO, cast

from kernel.analyzer import scan
from kernel.analyzer.reader import SNIFF_BYTES, InputError, PrefixedReader, Readable, iter_lines, looks_binary
from kernel.analyzer.rules import Rules, default_rules
from kernel.analyzer.stream import ErrorFinding, StreamAnalyzer

GZIP_MAGIC = b"\x1f\x8b"
SPOOL_BYTES = 8 << 20


@dataclass(frozen=True)
class Analysis:
    first_error: ErrorFinding | None
    phases_seen: tuple[str, ...]
    healthy: bool
    lines: int
    why: tuple[str, ...] = ()  # why this line, phase and category; the stop and the wrappers passed over

    @property
    def phase(self) -> str | None:
        return self.first_error.phase if self.first_error else None

    def to_json(self, explain: bool = False) -> dict[str, Any]:
        """The stable contract of `k3repro analyze --json` (issue 3); `explain` adds the reasons."""
        error = self.first_error
        out = {
            "phase": error.phase if error else None,
            "first_error": {"line": error.line, "lineno": error.line_no} if error else None,
            "category": error.category if error else None,
            "secondary_oom": error.secondary_oom if error else False,
            "hint": error.hint if error else None,
            "phases_seen": list(self.phases_seen),
            "signature": error.signature if error else "",
            # What placed the phase (ErrorFinding.phase_from; phase "" with "unknown": nothing did).
            "phase_from": error.phase_from if error else None,
            # "low": the log ends inside the error's traceback, before its exception line.
            "confidence": ("high" if error.confident else "low") if error else None,
        }
        if explain:
            out["explain"] = list(self.why)
        return out

    def to_text(self, context: bool = True, explain: bool = False) -> str:
        """A short summary for a person in an incident; `explain` adds why (to trust or challenge it)."""
        phases = " → ".join(self.phases_seen) or "none"
        error = self.first_error
        why = ["why:", *(f"  {reason}" for reason in self.why)] if explain and self.why else []
        if error is None:
            state = "healthy: the server reached readiness" if self.healthy else "no error found"
            return "\n".join([f"{state} ({self.lines} lines; phases seen: {phases})", *why])
        out = [
            f"phase:         {error.phase or 'unknown'} (from {error.phase_from or 'unknown'})",
            f"category:      {error.category}",
            f"first error:   line {error.line_no}: {error.line}",
            f"secondary OOM: {'yes' if error.secondary_oom else 'no'}",
            f"hint:          {error.hint}",
            f"phases seen:   {phases}",
            f"signature:     {error.signature}",
        ]
        if not error.confident:
            out.insert(3, "confidence:    low (the log ends inside this traceback, before its exception line)")
        if context and error.context:
            out.append("context:")
            out += [f"  {'>' if line == error.line else ' '} {line}" for line in error.context]
        return "\n".join([*out, *why])


def _finish(analyzer: StreamAnalyzer, context: tuple[str, ...] | None = None) -> Analysis:
    analyzer.close()
    error = analyzer.first_error
    later: tuple[str, ...] = ()
    if error is not None and analyzer.secondary_oom != error.secondary_oom:
        # An OOM that followed a different first error is only known after the finding went out.
        hint = f"{error.hint} {analyzer.rules.secondary_oom_hint}".strip()
        error = replace(error, secondary_oom=True, hint=hint)
        later = ("secondary OOM: an out-of-memory error followed this different first error",)
    if error is not None and context is not None:
        error = replace(error, context=context)
    why = (*(error.why if error else ()), *later, *analyzer.explain())
    return Analysis(error, analyzer.phases_seen, analyzer.healthy, analyzer.lines, why)


def analyze_lines(lines: Iterable[str], rules: Rules | None = None) -> Analysis:
    """Feed an iterable of lines, then close: exactly what a live stream gets."""
    analyzer = StreamAnalyzer(rules)
    feed = analyzer.feed
    for line in lines:
        feed(line, 0.0)
    return _finish(analyzer)


def analyze_text(text: str, rules: Rules | None = None) -> Analysis:
    """A whole log held in memory."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return analyze_lines(lines, rules)


def analyze_stream(
    stream: BinaryIO,
    name: str = "-",
    rules: Rules | None = None,
    *,
    max_bytes: int | None = None,
    progress: scan.Progress | None = None,
) -> Analysis:
    """A log read from a byte stream (a file, a pipe), with memory flat in its size. InputError for
    binary data or more than max_bytes. The lines that matter are found by kernel.analyzer.scan, with
    streaming's result; a pipe (or a gzip) is spooled to a temporary file first, so it takes that path too
    and its first error's context can be read again. `progress` is told the bytes done as it goes."""
    rules = rules or default_rules()
    fast = scan.usable(stream, rules)
    start = stream.tell() if fast else 0
    head = stream.read(SNIFF_BYTES)
    if head.startswith(GZIP_MAGIC):
        return _analyze_gzip(PrefixedReader(head, stream), name, rules, max_bytes, progress)
    _refuse_binary(head, f"{name}: binary data")
    if fast:
        size = stream.seek(0, io.SEEK_END) - start
        if max_bytes is not None and size > max_bytes:
            raise InputError(f"input is larger than {max_bytes // (1 << 20)} MiB")
        stream.seek(start)
        return _finish(*scan.analyze_file(stream, rules, progress=progress))
    return _analyze_read(head, stream, rules, max_bytes, progress)


def _analyze_read(
    head: bytes, rest: Readable, rules: Rules, max_bytes: int | None, progress: scan.Progress | None
) -> Analysis:
    """A stream that cannot seek: spooled to a temporary file and scanned (the head first); every line
    streamed without Hyperscan. InputError past max_bytes."""
    if not scan.available(rules):
        lines = iter_lines(PrefixedReader(head, rest), max_line_chars=rules.line.max_chars, max_bytes=max_bytes)
        return analyze_lines(lines, rules)
    with tempfile.TemporaryFile(prefix="k3repro-analyze-") as spool:
        spool.write(head)
        done = len(head)
        for count in _spool(rest, spool):
            done += count
            if max_bytes is not None and done > max_bytes:
                raise InputError(f"input is larger than {max_bytes // (1 << 20)} MiB")
            if progress is not None:
                progress(done, None)
        spool.seek(0)
        return _finish(*scan.analyze_file(cast(BinaryIO, spool), rules, progress=progress))


def _spool(rest: Readable, spool: BinaryIO) -> Iterator[int]:
    """Copy the rest of a stream to the spool, up to SPOOL_BYTES a step: how many bytes each step moved. A pipe
    (`cat vllm.log | k3repro analyze -`) is spliced, page by page inside the kernel, after what its reader
    holds already; anything else is read and written."""
    if isinstance(rest, io.BufferedReader) and hasattr(os, "splice"):
        held = rest.read(len(rest.peek(1)))  # what the reader holds (one read of the pipe if nothing)
        spool.write(held)
        spool.flush()
        yield len(held)
        try:
            fd, out = rest.fileno(), spool.fileno()
            count = os.splice(fd, out, SPOOL_BYTES)
        except OSError:  # not a pipe (a terminal, a socket): read as anything else
            count = -1
        if count >= 0:
            while count:
                yield count
                count = os.splice(fd, out, SPOOL_BYTES)
            return
    while chunk := rest.read(SPOOL_BYTES):
        spool.write(chunk)
        yield len(chunk)


def _refuse_binary(head: bytes, what: str) -> None:
    if looks_binary(head):
        raise InputError(f"{what}, not a text log")


def _analyze_gzip(
    raw: PrefixedReader, name: str, rules: Rules, max_bytes: int | None, progress: scan.Progress | None
) -> Analysis:
    """A rotated log as logrotate and the kubelet leave it (`vllm.log.1.gz`, `0.log.20261204-101010.gz`): read
    as it is unpacked, every line streamed; max_bytes counts what it unpacks to, so a bomb stops there."""
    try:
        unpacked = gzip.GzipFile(fileobj=cast(BinaryIO, raw), mode="rb")  # read() is all it uses
        head = unpacked.read(SNIFF_BYTES)
        _refuse_binary(head, f"{name}: gzip of binary data")
        return _analyze_read(head, unpacked, rules, max_bytes, progress)
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise InputError(f"{name}: a damaged or cut-off gzip file ({exc or type(exc).__name__})") from None


def analyze_path(
    path: str | Path,
    rules: Rules | None = None,
    *,
    max_bytes: int | None = None,
    progress: scan.Progress | None = None,
) -> Analysis:
    """A log file; OSError when it cannot be read, InputError as for analyze_stream."""
    with open(path, "rb") as stream:
        return analyze_stream(stream, str(path), rules, max_bytes=max_bytes, progress=progress)


__all__ = ["Analysis", "InputError", "analyze_lines", "analyze_path", "analyze_stream", "analyze_text"]
