"""The terminal's view of a run: the same Block Kit blocks Slack gets (bot/blocks.py), printed as text."""

from __future__ import annotations

import re
from datetime import UTC
from typing import Any

from bot.blocks import Block, EventBlocks
from protos import runner_pb2 as pb

INDENT = " " * 11
_FENCE = re.compile(r"```(.*?)```", re.DOTALL)
_BOLD = re.compile(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])")
_LINK = re.compile(r"<(?:[@#!])?([^<>|]+)(?:\|([^<>]+))?>")


class TextRenderer:
    """A run's events as text, in order: each event's blocks, the first line stamped with the event's time."""

    def __init__(self, *, logs: bool = False) -> None:
        self._blocks = EventBlocks(logs=logs)

    def lines(self, event: pb.RunEvent) -> list[str]:
        body = text_lines(self._blocks.of(event))
        if not body:
            return []
        stamp = event.at.ToDatetime(tzinfo=UTC).strftime("%H:%M:%S")
        return [f"[{stamp}] {body[0]}", *(f"{INDENT}{line}" for line in body[1:])]


def text_lines(blocks: list[Block]) -> list[str]:
    """Blocks as plain text: mrkdwn marks dropped, code as `| ` lines, fields on one line; buttons left out."""
    lines: list[str] = []
    for block in blocks:
        if block["type"] == "section" and "fields" in block:
            lines.append(" · ".join(_mrkdwn(f["text"]).replace("\n", ": ", 1) for f in block["fields"]))
        if block["type"] == "section" and "text" in block:
            lines += _mrkdwn_lines(block["text"]["text"])
        elif block["type"] == "context":
            lines += _mrkdwn_lines(" ".join(e["text"] for e in block["elements"] if "text" in e))
    return lines


def _mrkdwn_lines(text: str) -> list[str]:
    lines: list[str] = []
    position = 0
    for fence in _FENCE.finditer(text):
        lines += _mrkdwn(text[position : fence.start()]).splitlines()
        lines += [f"| {line}" for line in fence.group(1).split("\n")]
        position = fence.end()
    lines += _mrkdwn(text[position:]).splitlines()
    return [line for line in lines if line.strip()]


def _mrkdwn(text: str) -> str:
    text = _LINK.sub(lambda m: m.group(2) or ("@" + m.group(1) if m.group(0)[1] == "@" else m.group(1)), text)
    return _BOLD.sub(r"\1", text).replace("`", "")


def run_header(run: dict[str, Any]) -> str:
    return (
        f"run {run['id']} · cluster {run['cluster']} · runner {run['runner']} · image {run['image']} · "
        f"{run['status']}" + (f" · decision {run['decision']}" if run.get("decision") else "")
    )
