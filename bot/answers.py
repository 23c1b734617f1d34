"""What the operations answer, in the same words in Slack and in the terminal: each front-end only renders
these lines (Slack as mrkdwn, the terminal as text through `blocks.text_lines`)."""

from __future__ import annotations

from dataclasses import dataclass

from bot.dispatcher import RunnerState
from bot.store import Change, RunState


@dataclass(frozen=True)
class Cancelled:
    """`Coordinator.cancel`'s result: the runner's answer, or (`ended` set) the status of a run that had
    already ended, for which the runner was not asked."""

    run_id: str
    answer: str = ""
    ended: RunState | None = None


def cancelled(result: Cancelled) -> str:
    if result.ended:
        return f"run `{result.run_id}` already ended ({result.ended})"
    return f"run `{result.run_id}`: {result.answer}"


def noted(change: Change) -> str:
    return f"noted for {change.cluster} at {change.at}: {change.what}"


def runner_line(cluster: str, state: RunnerState, *, private: bool) -> str:
    """One runner: its name, backend, labels and whether it is busy for anyone; where it listens, its host
    name and why it cannot be reached (which names the address) only when `private` (the cluster's operators:
    where the GPU hosts listen is not for every channel member)."""
    where = f" `{state.address}`" if private else ""
    d = state.description
    if d is None:
        return f"• {cluster}{where} unreachable" + (f": {state.error}" if private else "")
    doing = f"busy: {', '.join(d.active_run_ids)}" if d.active_run_ids else "idle"
    host = f" ({d.hostname})" if private else ""
    labels = f" labels={','.join(d.labels)}" if d.labels else ""
    return f"• {cluster}{where} {d.name}{host} {d.backend}{labels} {doing}"
