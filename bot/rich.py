"""What a message says, as structure: blocks of spans (plain, bold, italic, code, a code block, a mention, a
channel, a link) and fields,
built once by bot/blocks.py and rendered twice: to Block Kit mrkdwn for Slack (`mrkdwn_blocks`) and to text for
the terminal (`lines`). Neither renderer reads the other's output.

Escaping happens only in the mrkdwn renderer: every span's text is the text as it was (an engine's line, a
person's words), so a `<!channel>` or `<https://…|Fix applied>` in it is shown in Slack, never obeyed, and the
terminal prints it unchanged. Slack's length limits (`limit`) apply to the mrkdwn only: the terminal and the
overflow file show the whole text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

Block = dict[str, Any]
_MENTION = re.compile(r"<(@[UW]|#[CGD])([A-Z0-9-]{1,20})>")  # how the bot writes a user or channel into text


class Style(Enum):
    PLAIN = "plain"
    BOLD = "bold"
    ITALIC = "italic"
    CODE = "code"  # inline code
    FENCE = "fence"  # a code block; its lines joined by newlines
    MENTION = "mention"  # a Slack user id
    CHANNEL = "channel"  # a Slack channel id
    LINK = "link"  # `text` shown, `target` the URL


@dataclass(frozen=True)
class Span:
    text: str
    style: Style = Style.PLAIN
    target: str = ""  # a link's URL


Text = tuple[Span, ...]
Part = str | Span  # a str is plain text


def text(*parts: Part) -> Text:
    """Spans from parts written in order; empty plain parts are dropped (an optional clause left out)."""
    return tuple(Span(part) if isinstance(part, str) else part for part in parts if part)


def bold(text: str) -> Span:
    return Span(text, Style.BOLD)


def italic(text: str) -> Span:
    return Span(text, Style.ITALIC)


def code(text: str) -> Span:
    return Span(text, Style.CODE)


def fence(lines: Iterable[str]) -> Span:
    return Span("\n".join(lines), Style.FENCE)


def mention(user: str) -> Span:
    return Span(user, Style.MENTION)


def channel(channel_id: str) -> Span:
    return Span(channel_id, Style.CHANNEL)


def link(label: str, url: str) -> Span:
    return Span(label, Style.LINK, url)


def mentioning(raw: str) -> Text:
    """Text the bot wrote user or channel mentions into (`<@U1>`: who cancelled, in the reason the runner echoes;
    `<#C1>`: where a cluster is operated, in a refusal) as spans: a mention can only name one person or channel,
    so it stays one; all else is plain."""
    parts: list[Part] = []
    position = 0
    for found in _MENTION.finditer(raw):
        sigil, name = found.group(1)[0], found.group(1)[1:] + found.group(2)
        parts += [raw[position : found.start()], mention(name) if sigil == "@" else channel(name)]
        position = found.end()
    return text(*parts, raw[position:])


def joined(texts: Sequence[Text], separator: Part = "\n") -> Text:
    """Texts one after another (lines, by default), as `str.join` joins strings."""
    out: list[Part] = []
    for n, item in enumerate(texts):
        out += ([separator] if n else []) + list(item)
    return text(*out)


@dataclass(frozen=True)
class Section:
    body: Text
    block_id: str = ""
    limit: int = 0  # Slack's: the mrkdwn is clipped to it


@dataclass(frozen=True)
class Context:
    body: Text
    limit: int = 0


@dataclass(frozen=True)
class Field:
    name: str
    value: Text
    limit: int = 0


@dataclass(frozen=True)
class Fields:
    fields: tuple[Field, ...]
    block_id: str = ""


@dataclass(frozen=True)
class SlackOnly:
    """A Block Kit block with nothing to read (buttons): Slack gets it, the terminal leaves it out."""

    block: Block


Item = Section | Context | Fields | SlackOnly


# Slack: Block Kit mrkdwn


def escaped(raw: str) -> str:
    """Text as Slack's mrkdwn shows it literally: `&`, `<`, `>` as the entities Slack's formatting rules ask
    for, so no mention, link or date can be made of it."""
    return raw.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def clip(raw: str, limit: int) -> str:
    return raw if len(raw) <= limit else raw[: limit - 1] + "…"


_MARK = {Style.PLAIN: "", Style.BOLD: "*", Style.ITALIC: "_"}


def mrkdwn(body: Text, limit: int = 0) -> str:
    """Spans as mrkdwn: untrusted text escaped, in code blocks too (where ``` would end the block early)."""
    out = []
    for span in body:
        if span.style is Style.FENCE:
            out.append("```" + "\n".join(escaped(line).replace("```", "'''") for line in span.text.split("\n")) + "```")
        elif span.style is Style.MENTION:
            out.append(f"<@{escaped(span.text)}>")
        elif span.style is Style.CHANNEL:
            out.append(f"<#{escaped(span.text)}>")
        elif span.style is Style.LINK:  # `|` would end the URL early: percent-encoded, as in any URL
            out.append(f"<{escaped(span.target).replace('|', '%7C')}|{escaped(span.text)}>")
        elif span.style is Style.CODE:  # a backtick would end the code early
            out.append("`" + escaped(span.text).replace("`", "'") + "`")
        else:
            out.append(_MARK[span.style] + escaped(span.text) + _MARK[span.style])
    rendered = "".join(out)
    return clip(rendered, limit) if limit else rendered


def mrkdwn_block(item: Item) -> Block:
    if isinstance(item, Section):
        block: Block = {"type": "section", "text": {"type": "mrkdwn", "text": mrkdwn(item.body, item.limit)}}
        if item.block_id:
            block["block_id"] = item.block_id
        return block
    if isinstance(item, Context):
        return {"type": "context", "elements": [{"type": "mrkdwn", "text": mrkdwn(item.body, item.limit)}]}
    if isinstance(item, Fields):
        block = {"type": "section", "block_id": item.block_id} if item.block_id else {"type": "section"}
        block["fields"] = [
            {"type": "mrkdwn", "text": f"*{escaped(f.name)}*\n{mrkdwn(f.value, f.limit)}"} for f in item.fields
        ]
        return block
    return item.block


def mrkdwn_blocks(items: Iterable[Item]) -> list[Block]:
    return [mrkdwn_block(item) for item in items]


# The terminal: text


def plain(body: Text) -> str:
    """Spans as one text: no marks, a mention as `@U1`, a channel as `#C1`, a link as `label (URL)`, a code block's
    lines as `| ` lines."""
    return "\n".join(_lines(body))


def lines(items: Iterable[Item]) -> list[str]:
    """Blocks as the terminal prints them: blank lines dropped, fields on one line, buttons left out."""
    out: list[str] = []
    for item in items:
        if isinstance(item, Fields):
            out.append(" · ".join(f"{f.name}: {plain(f.value)}" for f in item.fields))
        elif isinstance(item, (Section, Context)):
            out += [line for line in _lines(item.body) if line.strip()]
    return out


def _lines(body: Text) -> list[str]:
    """A code block's lines are its own (a `\r` in an engine's progress bar does not split one)."""
    out: list[str] = []
    words: list[str] = []
    for span in body:
        if span.style is Style.FENCE:
            out += "".join(words).splitlines() + [f"| {line}" for line in span.text.split("\n")]
            words = []
        else:
            words.append(_PREFIX.get(span.style, "") + span.text + (f" ({span.target})" if span.target else ""))
    return out + "".join(words).splitlines()


_PREFIX = {Style.MENTION: "@", Style.CHANNEL: "#"}
