"""Engine output as lines, bounded: the one line splitter every backend's pump feeds.

An engine can write anything: a line of many MiB (a tensor printed whole, a binary dump), or no newline at all.
Each line keeps its first LINE_LIMIT bytes and says how many it dropped; the stream is read on, so the next
lines are still delivered (and analysed). Every byte is looked at once: no buffer is joined or scanned again as
more arrives, so a long line costs its length, not its length squared.
"""

from __future__ import annotations

LINE_LIMIT = 64 * 1024  # bytes of one line that are kept


def dropped_marker(dropped: int) -> str:
    return f" [k3repro: {dropped} more bytes of this line dropped, lines keep their first {LINE_LIMIT} bytes]"


class LineSplitter:
    """Feed it bytes as they come; it gives back the complete lines (without their newline, a trailing CR
    removed), each at most LINE_LIMIT bytes plus the marker of what was dropped."""

    def __init__(self, limit: int = LINE_LIMIT) -> None:
        self.limit = limit
        self._head = bytearray()  # the current line's kept bytes (at most `limit`)
        self._dropped = 0  # the current line's bytes past the limit

    def feed(self, data: bytes) -> list[str]:
        lines: list[str] = []
        view = memoryview(data)
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            self._keep(view[start:end])
            lines.append(self._line())
            start = end + 1
        self._keep(view[start:])
        return lines

    def close(self) -> list[str]:
        """The stream ended: its last line, when it had no newline."""
        return [self._line()] if self._head or self._dropped else []

    def _keep(self, part: memoryview) -> None:
        room = self.limit - len(self._head)
        if room > 0:
            self._head += part[:room]
        self._dropped += max(0, len(part) - room)

    def _line(self) -> str:
        raw = self._head[:-1] if not self._dropped and self._head.endswith(b"\r") else self._head
        text = raw.decode("utf-8", "replace")
        if self._dropped:
            text += dropped_marker(self._dropped)
        self._head = bytearray()
        self._dropped = 0
        return text
