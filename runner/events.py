"""Building RunEvents: one place that assigns seq and timestamps, journals, and wakes watchers."""

from __future__ import annotations

import asyncio
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from protos import runner_pb2 as pb
from runner.journal import Journal


class EventLog:
    """Per-runner event sequencing; `changed` is notified after every journaled event."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.changed = asyncio.Condition()
        self._seq: dict[str, int] = {}

    async def emit(self, run_id: str, **payload: Any) -> pb.RunEvent:
        seq = self._seq.get(run_id)
        if seq is None:
            seq = self.journal.last_seq(run_id)
        seq += 1
        self._seq[run_id] = seq
        event = pb.RunEvent(run_id=run_id, seq=seq, at=now(), **payload)
        self.journal.append(event)
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
