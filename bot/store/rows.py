"""What the store gives back: one frozen dataclass per table, its fields the table's columns in their order
(so `dataclasses.asdict` is the row as stored, for the JSON that shows one), and the run statuses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from protos.vocab import Decision, RunStatus


class RunState(StrEnum):
    """A run's status in the store: running until its runner's run_finished says how it ended (a RunStatus,
    the same ids), or until the bot gave up on it (lost). Its values are the stored strings."""

    RUNNING = "running"
    COMPLETED = RunStatus.COMPLETED.value
    CANCELLED = RunStatus.CANCELLED.value
    ERROR = RunStatus.ERROR.value
    LOST = "lost"


class RerunVerdict(StrEnum):
    """What an isolated rerun says of its original (bot/rerun.py's `compare`)."""

    REPRODUCED = "reproduced"
    NOT_REPRODUCED = "not_reproduced"
    DIFFERENT_FAILURE = "different_failure"


class OutboxState(StrEnum):
    """A Slack write's progress in the outbox: pending until it is sent, or failed (given up)."""

    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


# The one-active-run-per-cluster index (migration 6) covers ACTIVE.
ACTIVE = (RunState.RUNNING,)
FINAL = (RunState.COMPLETED, RunState.CANCELLED, RunState.ERROR, RunState.LOST)


@dataclass(frozen=True)
class Run:
    """`rerun_of`: the original, for an isolated rerun; None otherwise. `channel`/`thread_ts`: its Slack card."""

    id: str
    cluster: str
    runner: str
    status: RunState
    requested_by: str
    channel: str | None
    thread_ts: str | None
    image: str
    request_json: str
    decision: Decision | None
    summary: str | None
    created_at: str
    updated_at: str
    finished_at: str | None
    rerun_of: str | None

    def __post_init__(self) -> None:
        """The stored strings as their members (a bad one is a ValueError naming it)."""
        object.__setattr__(self, "status", RunState(self.status))
        object.__setattr__(self, "decision", Decision(self.decision) if self.decision else None)

    @property
    def minimize_of(self) -> str:
        """A minimize run's original (its request names it); "" for any other run."""
        try:
            asked = json.loads(self.request_json or "{}")
        except ValueError:
            return ""
        return str(asked.get("minimize_of") or "") if isinstance(asked, dict) else ""


@dataclass(frozen=True)
class Rerun:
    """An isolated rerun's link to its original: where it ran, what ends that placement, and its verdict."""

    run_id: str
    original_id: str
    provider: str  # static | slurm | kubernetes
    placement: str  # a runner address, a Slurm job, a Kubernetes Job
    bundle_sha256: str
    verdict: RerunVerdict | Literal[""] | None  # None until it ends, "" when it ended without one
    comparison_json: str | None
    created_at: str
    handle: str | None  # a Slurm job id, a Kubernetes Job name; None for a static runner

    def __post_init__(self) -> None:
        if self.verdict:
            object.__setattr__(self, "verdict", RerunVerdict(self.verdict))


@dataclass(frozen=True)
class Change:
    """One line of a cluster's change log."""

    id: int
    cluster: str
    at: str
    what: str
    by: str
    via: str


@dataclass(frozen=True)
class AuditEntry:
    """`place`: where the action was asked for (a Slack channel id; empty for the terminal)."""

    id: int
    at: str
    actor: str
    action: str
    target: str
    detail: str
    via: str
    place: str | None


@dataclass(frozen=True)
class Thread:
    """A run's Slack thread: its channel, and the ts of the card (its parent) and of the live checklist once
    Slack has them."""

    run_id: str
    channel: str
    team_domain: str
    parent_ts: str | None
    checklist_ts: str | None
    created_at: str

    def ts(self, ref: str) -> str | None:
        """The ts of the message `ref` names (parent_ts or checklist_ts); None until it is posted."""
        return {"parent_ts": self.parent_ts, "checklist_ts": self.checklist_ts}[ref]


@dataclass(frozen=True)
class OutboxRow:
    """One Slack write as the outbox keeps it: `payload_json` is the write itself, the rest its progress."""

    id: int
    key: str  # idempotency key: one row per message write; updates of one message share a row
    lane: str  # writes of one lane go out in order, paced together
    run_id: str
    method: str
    payload_json: str
    state: OutboxState
    version: int  # bumped by every coalesced update; a send completes only the version it sent
    attempts: int
    not_before: float  # unix time: retry-after / backoff
    error: str | None
    created_at: str
    sent_at: str | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", OutboxState(self.state))


@dataclass(frozen=True)
class Posted:
    """A run's message Slack took, which later writes refer to: `ref` is the thread's column for it
    (parent_ts, the card, which is also the run's place; or checklist_ts)."""

    run_id: str
    ref: str
    channel: str
    ts: str | None
