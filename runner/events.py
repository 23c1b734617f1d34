"""Building RunEvents: the one place that redacts, assigns seq and timestamps, journals, and wakes watchers.

Every event a stage emits passes here, so redaction happens once for all of them (engine error texts, stage
and run summaries, artifacts) rather than in each stage. A seq is spent only on an event the journal wrote:
a failed write leaves no gap, and ends the run (JournalWriteError from every later emit of that run).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from kernel.redact import redactor
from protos import runner_pb2 as pb
from runner.journal import Journal


class JournalWriteError(Exception):
    """The journal could not write an event (a full or read-only disk): the run cannot go on unrecorded."""


class EventLog:
    """Per-runner event sequencing; `changed` is notified after every journaled event."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.changed = asyncio.Condition()
        self._seq: dict[str, int] = {}
        self.broken: dict[str, str] = {}  # run id -> why its journal write failed
        self.unjournaled: dict[str, pb.RunEvent] = {}  # a run's last event, when even that could not be written
        self.observers: list[Callable[[pb.RunEvent], None]] = []  # told every event with a seq (the metrics)

    async def emit(self, run_id: str, **payload: Any) -> pb.RunEvent:
        finished = "run_finished" in payload
        if run_id in self.broken and not finished:
            raise JournalWriteError(self.broken[run_id])
        seq = self._seq.get(run_id)
        if seq is None:
            seq = self.journal.last_seq(run_id)
        event = redactor().message(pb.RunEvent(run_id=run_id, seq=seq + 1, at=now(), **payload))
        try:
            self.journal.append(event)
        except sqlite3.Error as exc:
            reason = f"the runner's journal could not record an event ({exc}); the run was stopped"
            self.broken.setdefault(run_id, reason)
            if not finished:
                raise JournalWriteError(reason) from None
            self.unjournaled[run_id] = event  # still told to watchers; a restarted runner closes the run
        self._seq[run_id] = event.seq
        for observe in self.observers:
            observe(event)
        async with self.changed:
            self.changed.notify_all()
        return event


def now() -> Timestamp:
    stamp = Timestamp()
    stamp.GetCurrentTime()
    return stamp


def heartbeat(run_id: str, last_seq: int, stage: pb.Stage) -> pb.RunEvent:
    """Heartbeats carry seq 0: they are not part of the run's sequence and are never journaled."""
    return pb.RunEvent(run_id=run_id, seq=0, at=now(), heartbeat=pb.Heartbeat(last_seq=last_seq, stage=stage))
