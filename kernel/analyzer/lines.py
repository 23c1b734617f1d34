"""One raw log line taken apart: what to show, which stream it belongs to, its level and message.

vLLM output is several processes' lines interleaved, wrapped by collectors, coloured and overwritten by
progress bars; everything later works on the parts this module separates, using only the line syntax
of rules.toml.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from kernel.analyzer.rules import LineSyntax

# A quoted value up to its closing quote (escaped quotes and backslashes inside), and one escape in it.
_QUOTED_VALUE = re.compile(r'(?>(?:[^"\\]|\\.)*)')  # atomic, not `*+`: see kernel/toml_reader.py
_ESCAPE = re.compile(r'\\(["\\])')
# The end of a log header (`[core.py:866]`), and a colour code (real, or pasted as caret text) at the end of a text:
# what a joined line's start may follow.
_HEADER_END = re.compile(r"\.py:\d++\]\Z")
_TRAILING_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;]*+m\Z")
# What ends a process prefix (`pid=8453)`, `rank=1 pid=336)`, `ip=10.0.0.1)`).
_PROCESS_KEY = re.compile(r"\b(?:pid|rank|ip)=[^\s,()=]*+\)\Z")


@dataclass(frozen=True, slots=True)
class LogLine:
    display: str  # the line as a person would quote it (labels.jsonl's first_error_line)
    text: str  # without collector wrappers and process prefixes: the log header and the message
    msg: str  # the message: `text` without the log header
    proc: str  # the process prefix(es), e.g. "(Worker_TP3 pid=8456)"; "" for none
    level: str | None  # "ERROR", "INFO", ... when the line has a log header
    src: str  # the header's call site ("core.py:866"); "" for none


class LineParser:
    def __init__(self, syntax: LineSyntax) -> None:
        self._max = syntax.max_chars
        self._ansi = syntax.ansi
        self._process = syntax.process
        # The alternatives of each list in one pattern: one `match` per line instead of one per entry.
        self._wrappers = re.compile("|".join(f"(?:{w.pattern})" for w in syntax.wrappers) or r"(?!)")
        self._quoted = syntax.quoted
        self._relogged = syntax.relogged
        self._error_levels = syntax.error_levels
        self._joined = syntax.joined
        self._suffixes = re.compile("|".join(f"(?:{s.pattern})" for s in syntax.suffixes) or r"(?!)")
        parts = []
        self._header_groups: list[tuple[str, str | None]] = []
        for i, header in enumerate(syntax.headers):
            pattern = header.pattern.replace("(?P<level>", f"(?P<level{i}>")
            src = f"src{i}" if "(?P<src>" in pattern else None
            pattern = pattern.replace("(?P<src>", f"(?P<src{i}>")
            parts.append(f"(?:{pattern})")
            self._header_groups.append((f"level{i}", src))
        self._headers = re.compile("|".join(parts) or r"(?!)")

    def display(self, raw: str) -> str:
        """The quotable line: trailing CR dropped; a line that starts coloured shows from its last colour code."""
        raw = raw.rstrip("\r\n")
        if raw.startswith("\x1b"):
            last_end = max((m.end() for m in self._ansi.finditer(raw)), default=0)
            return raw[last_end:].lstrip(" ")
        return raw

    def _parse(self, raw: str) -> LogLine:
        if len(raw) > self._max:
            raw = raw[: self._max]
        text = raw.rstrip("\r\n")
        display = text
        if "\x1b" in text:
            display = self.display(text)
            text = self._ansi.sub("", text)
        elif "^[[" in text:  # colour codes pasted as caret text: the display keeps them, as the paste has them
            text = self._ansi.sub("", text)
        text = self._unwrapped(text)
        proc, text = self._process_prefixes(text)
        if proc and (inner := self._unwrapped(text)) is not text:
            # (a process's own output in a collector's or a script's wrapper: a Ray actor, a torch rank printing
            # timestamped lines, `(TaskRunner pid=1) 2025-06-06T19:02:40Z (WorkerDict pid=2) ERROR …`)
            inner_proc, text = self._process_prefixes(inner)
            proc = f"{proc} {inner_proc}".strip()
        if not proc and "pid=" in text:
            proc, text = self._behind_unknown_wrapper(text)
        if "\r" in text:
            # A progress bar redraws itself with CR: what stays on the terminal is the last segment.
            text = next((seg for seg in reversed(text.split("\r")) if seg.strip()), "")
        if suffix := self._suffixes.search(text):
            text = text[: suffix.start()].rstrip()
        level, src, msg = self._header(text)
        while level is not None:
            inner_proc, inner = self._process_prefixes(msg)
            inner_level, inner_src, inner_msg = self._header(inner)
            if inner_level is not None:
                # A wrapper script's logger re-logging vLLM's lines: the line it logs has its own prefix and header.
                proc = f"{proc} {inner_proc}".strip()
                text, level, src, msg = inner, inner_level, inner_src, inner_msg
                continue
            if level not in self._error_levels and self._relogged is not None and self._relogged.match(inner):
                # A re-logged traceback line: its level is the re-logger's, not the line's, which had no header.
                proc = f"{proc} {inner_proc}".strip()
                text, level, src, msg = inner, None, "", inner
            break
        return LogLine(display, text, msg, proc, level, src)

    def lines(self, raw: str) -> list[LogLine]:
        """The logged lines of one line: usually itself; a paste that lost its line ends (Markdown outside a code
        block joins a paragraph's lines) holds several, each read on its own and quoted as the whole line."""
        raw = raw[: self._max]
        starts = self._starts(raw)
        if len(starts) == 1:
            return [self._parse(raw)]
        display = self._parse(raw).display
        pieces = [raw[a:b].rstrip() for a, b in zip(starts, [*starts[1:], len(raw)], strict=True)]
        return [replace(self._parse(piece), display=display) for piece in pieces if piece.strip()]

    def parse(self, raw: str) -> LogLine:
        """The line taken apart; one that joins several logged lines (see lines()) has no one level."""
        line = self._parse(raw)
        return replace(line, level=None) if len(self._starts(raw[: self._max])) > 1 else line

    def _starts(self, raw: str) -> list[int]:
        """Where the logged lines of a line start: 0, and where another's log header (rules.toml [line] joined), with
        the process prefixes and colour codes before it, follows other text than the collectors' wrappers or a log
        header (the line's own start, or a re-logged line)."""
        starts = [0]
        if self._joined is None or "\r" in raw.rstrip("\r\n"):
            return starts  # (a progress bar's redrawn segments are read as the terminal shows them, see _parse)
        own = -1  # where the collectors' wrappers (and a quoted value's opening) end: the line's own start
        for match in self._joined.finditer(raw):
            end = self._before(raw, match.start())
            begin = len(raw) - len(raw[end:].lstrip())
            if end == 0 or (begin == end and raw[end - 1] != "]"):
                # the line's start, or glued to a word (not to a closing bracket: a progress bar's rate field,
                # `[00:00<?, ?it/s]ERROR 09-24 …`, the header written after the bar without a line end)
                continue
            if own < 0:
                own = 0
                while (wrap := self._wrappers.match(raw, own) or (self._quoted and self._quoted.match(raw, own))) and (
                    wrap.end() > own
                ):
                    own = wrap.end()
            if end > own and not _HEADER_END.search(raw, max(0, end - 80), end):
                starts.append(begin)
        return starts

    def _before(self, raw: str, at: int) -> int:
        """Where the text before a log header at `at` ends, stepping back over whitespace, colour codes and the
        process prefixes of its line."""
        end = len(raw[:at].rstrip())
        while end:
            if ansi := _TRAILING_ANSI.search(raw, max(0, end - 40), end):
                end = len(raw[: ansi.start()].rstrip())
                continue
            if raw[end - 1] != ")":
                return end
            # (a process prefix, also one with a space or parentheses in its name, or whose opening the paste cut at
            # the line's start)
            window = max(0, end - 200)
            if not _PROCESS_KEY.search(raw, window, end):
                return end
            opening = raw.rfind("(", window, end)  # (the one its closing parenthesis closes)
            while opening >= 0 and raw.count("(", opening, end) != raw.count(")", opening, end):
                opening = raw.rfind("(", window, opening)
            end = len(raw[:opening].rstrip()) if opening >= 0 else 0
        return end

    def _unwrapped(self, text: str) -> str:
        """`text` without the collectors' wrappers at its start (the same object when it has none)."""
        while True:
            if (match := self._wrappers.match(text)) and match.end():
                text = text[match.end() :]
            elif self._quoted is not None and (match := self._quoted.match(text)):
                # (the value's own text: what follows its closing quote is the collector's other fields)
                value = _QUOTED_VALUE.match(text, match.end())
                assert value is not None  # (it matches the empty value too)
                text = _ESCAPE.sub(r"\1", value[0])
            else:
                return text

    def _behind_unknown_wrapper(self, text: str) -> tuple[str, str]:
        """A process's traceback line behind a wrapper no rule strips (a collector's or a host's format of its own,
        `19.12.25 02:07:16 host bash[22]: (EngineCore_DP0 pid=22)   File "…"`): the process prefix and the line it
        heads, else ("", text) unchanged. Only a traceback's line counts: a message may quote a `(pid=N)` mid-line."""
        opening = text.rfind("(", 0, text.find("pid="))
        if opening <= 0 or text[opening - 1] not in " \t" or self._relogged is None:
            return "", text
        proc, rest = self._process_prefixes(text[opening:])
        if not proc or not self._relogged.match(rest):
            return "", text
        return proc, rest

    def _process_prefixes(self, text: str) -> tuple[str, str]:
        """The process prefix(es) at the start of `text` ("" for none), and the rest."""
        if text[:1] not in "([":
            return "", text
        end = 0
        while match := self._process.match(text, end):
            end = match.end()
        return text[:end].rstrip(), text[end:]

    def _header(self, text: str) -> tuple[str | None, str, str]:
        """The log header's level (None: no header) and call site, and the message after it."""
        match = self._headers.match(text)
        if match is None:
            return None, "", text
        # (each header's alternative has its own level group: the one that matched names the level)
        level_group, src_group = next((lv, sv) for lv, sv in self._header_groups if match[lv] is not None)
        return match[level_group], (match[src_group] or "") if src_group else "", text[match.end() :]
