"""The terminal's view of a run: what each event says (bot/blocks.py), the structure Slack gets as Block Kit,
printed as text (bot/rich.py).

What reaches the terminal passes `terminal()`: redacted (the one path, kernel/redact.py) and stripped of
control sequences, so neither a secret nor a crafted escape in an engine's log or an imported bundle
reaches the screen.
"""

from __future__ import annotations

from datetime import UTC

from bot import rich
from bot.blocks import EventBlocks
from bot.store import Run
from kernel.redact import printable, redactor
from protos import runner_pb2 as pb

INDENT = " " * 11
PLACEHOLDER = "k3repro show RUN "  # what the blocks say of a long artifact; the terminal knows the run's id


class TextRenderer:
    """A run's events as text, in order: each event's blocks, the first line stamped with the event's time."""

    def __init__(self, *, logs: bool = False) -> None:
        self._blocks = EventBlocks(logs=logs)

    def lines(self, event: pb.RunEvent) -> list[str]:
        body = rich.lines(self._blocks.of(event))
        if not body:
            return []
        stamp = event.at.ToDatetime(tzinfo=UTC).strftime("%H:%M:%S")
        body = [line.replace(PLACEHOLDER, f"k3repro show {event.run_id} ") for line in body]  # the command to type
        return [terminal(f"[{stamp}] {body[0]}"), *(terminal(f"{INDENT}{line}") for line in body[1:])]


def run_header(run: Run) -> str:
    return terminal(
        f"run {run.id} · cluster {run.cluster} · runner {run.runner} · image {run.image} · "
        f"{run.status}" + (f" · decision {run.decision}" if run.decision else "")
    )


def unmentioned(text: str) -> str:
    """A run's stored text as the terminal shows it: a Slack user mention the bot wrote (who cancelled, in a
    verdict's reason) as `@U1`, not `<@U1>` markup."""
    return rich.plain(rich.mentioning(text))


def terminal(text: str) -> str:
    """Text as it may be printed: redacted, without terminal control sequences."""
    return printable(redactor().line(text))
