"""Reading a log from bytes: decoding, line splitting and limits, with memory flat in the file size.

Logs are decoded as UTF-8 with replacement (invalid bytes are common in pasted logs) and split on LF
only, so CR progress-bar redraws stay inside their line for the line parser to handle.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from typing import Protocol

CHUNK_BYTES = 1 << 20
SNIFF_BYTES = 64 * 1024
# More than this share of undecodable bytes in the first SNIFF_BYTES means it is not a text log.
MAX_INVALID_SHARE = 0.10


class InputError(ValueError):
    """The input is not a log we can analyze (binary, too large); the message is one line."""


def looks_binary(head: bytes) -> bool:
    """NUL bytes or mostly undecodable bytes: an image, an archive, a core file — not a log."""
    if b"\x00" in head:
        return True
    if not head:
        return False
    decoded = head.decode("utf-8", errors="replace")
    return decoded.count("\ufffd") > MAX_INVALID_SHARE * len(head)


class Readable(Protocol):
    """What a log is read from: a file, a pipe, an unpacked gzip stream."""

    def read(self, size: int = -1, /) -> bytes: ...


class PrefixedReader:
    """A byte stream whose first bytes were already read (to sniff them), readable again from the start."""

    def __init__(self, head: bytes, rest: Readable) -> None:
        self._head = head
        self._rest = rest

    def read(self, size: int = -1) -> bytes:
        if self._head:
            cut = len(self._head) if size < 0 else size  # never more than asked: a gzip reader counts on it
            head, self._head = self._head[:cut], self._head[cut:]
            return head
        return self._rest.read(size)


def iter_lines(stream: Readable, *, max_line_chars: int, max_bytes: int | None = None) -> Iterator[str]:
    """Lines of a byte stream without their LF. A line longer than max_line_chars is cut there (the
    rest is skipped without being held in memory). InputError past max_bytes."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    total = 0
    partial: list[str] = []
    partial_len = 0
    while True:
        chunk = stream.read(CHUNK_BYTES)
        if not chunk:
            break
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise InputError(f"input is larger than {max_bytes // (1 << 20)} MiB")
        text = decoder.decode(chunk)
        start = 0
        while True:
            end = text.find("\n", start)
            if end < 0:
                piece = text[start : start + max_line_chars - partial_len]
                if piece:
                    partial.append(piece)
                    partial_len += len(piece)
                break
            if partial:
                if partial_len < max_line_chars:
                    partial.append(text[start : min(end, start + max_line_chars - partial_len)])
                yield "".join(partial)
                partial.clear()
                partial_len = 0
            else:
                yield text[start : min(end, start + max_line_chars)]
            start = end + 1
    tail = decoder.decode(b"", final=True)
    if tail and partial_len < max_line_chars:
        partial.append(tail[: max_line_chars - partial_len])
    if partial:
        yield "".join(partial)
