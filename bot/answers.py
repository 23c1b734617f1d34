"""What the operations answer, in the same words in Slack and in the terminal: each is structure (bot/rich.py)
that each front-end renders (Slack as mrkdwn, the terminal as text)."""

from __future__ import annotations

from dataclasses import dataclass

from bot.dispatcher import RunnerState
from bot.rich import Text, code, mentioning, text
from bot.store import Change, RunState


@dataclass(frozen=True)
class Cancelled:
    """`Coordinator.cancel`'s result: the runner's answer, or (`ended` set) the status of a run that had
    already ended, for which the runner was not asked."""

    run_id: str
    answer: str = ""
    ended: RunState | None = None


def cancelled(result: Cancelled) -> Text:
    if result.ended:
        return text("run ", code(result.run_id), f" already ended ({result.ended})")
    return text("run ", code(result.run_id), ": ", *mentioning(result.answer))  # it echoes who cancelled


def noted(change: Change) -> Text:
    return text(f"noted for {change.cluster} at {change.at}: {change.what}")


def runner_line(cluster: str, state: RunnerState, *, private: bool) -> Text:
    """One runner: its name, backend, labels and whether it is busy for anyone; where it listens, its host
    name and why it cannot be reached (which names the address) only when `private` (the cluster's operators:
    where the GPU hosts listen is not for every channel member)."""
    where = (" ", code(state.address)) if private else ()
    d = state.description
    if d is None:
        return text(f"• {cluster}", *where, " unreachable" + (f": {state.error}" if private else ""))
    doing = f"busy: {', '.join(d.active_run_ids)}" if d.active_run_ids else "idle"
    host = f" ({d.hostname})" if private else ""
    labels = f" labels={','.join(d.labels)}" if d.labels else ""
    return text(f"• {cluster}", *where, f" {d.name}{host} {d.backend}{labels} {doing}")
