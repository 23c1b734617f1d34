"""What a run keeps, on either side (the runner's journal, the bot's store): `Retention` (a head and a rolling
tail of its log lines, finished runs kept `retention_days`), the capped log both write through, and the owner-only
file mode both state files get (`keep_private`)."""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from kernel.clock import WALL
from kernel.toml_reader import ConfigError, TomlReader
from protos import runner_pb2 as pb

MIB = 1024 * 1024
DAY_S = 86_400.0


@dataclass(frozen=True)
class Retention:
    """What a run may keep: `log_head_bytes` of its first log lines and a rolling `log_tail_bytes` of its
    last (a line weighs its UTF-8 bytes plus one); finished runs are kept `retention_days` (0: for ever)."""

    log_head_bytes: int = 8 * MIB
    log_tail_bytes: int = 8 * MIB
    retention_days: float = 30.0

    def cutoff(self) -> str | None:
        """The ISO time before which a finished run is pruned; None when runs are kept for ever."""
        if self.retention_days <= 0:
            return None
        return (WALL.utc() - timedelta(days=self.retention_days)).isoformat(timespec="milliseconds")


RETENTION_KEYS = ("log_head_mib", "log_tail_mib", "retention_days")  # top-level keys of runner.toml, k3repro.toml


def read_retention(reader: TomlReader) -> Retention:
    """The top-level `log_head_mib`, `log_tail_mib` (MiB of log lines a run keeps, first and last) and
    `retention_days` (how long a finished run is kept; 0: for ever), each 0 or more."""
    defaults = Retention()
    values = {
        key: reader.number(key, default)
        for key, default in zip(
            RETENTION_KEYS,
            (defaults.log_head_bytes / MIB, defaults.log_tail_bytes / MIB, defaults.retention_days),
            strict=True,
        )
    }
    for key, value in values.items():
        if not value >= 0:
            raise ConfigError(f"{reader.origin}: {key} must be 0 or more, got {value!r}")
    return Retention(
        log_head_bytes=int(values["log_head_mib"] * MIB),
        log_tail_bytes=int(values["log_tail_mib"] * MIB),
        retention_days=values["retention_days"],
    )


@dataclass
class LogBudget:
    """A run's log so far: bytes kept in its head and tail, what was dropped, and the chunk at the gap that
    says so (`marker_seq`, 0 before anything was dropped)."""

    head: int = 0
    head_closed: bool = False
    tail: int = 0
    dropped_lines: int = 0
    dropped_bytes: int = 0
    marker_seq: int = 0


def log_bytes(chunk: pb.LogChunk) -> int:
    return sum(len(line.encode("utf-8", "surrogatepass")) + 1 for line in chunk.lines)


def dropped_note(budget: LogBudget, retention: Retention) -> str:
    return (
        f"[k3repro] {budget.dropped_lines} log lines ({budget.dropped_bytes} bytes) dropped here: a run keeps the"
        f" first {_size(retention.log_head_bytes)} and the last {_size(retention.log_tail_bytes)} of its log"
    )


def _size(n: int) -> str:
    return f"{n / MIB:g} MiB" if n >= MIB else f"{n} bytes"


class CappedLog(ABC):
    """The per-run cap on log lines, for the runner's journal and the bot's store alike. Log chunks fill the
    run's head until the next would not fit; from then on each is kept in the tail, and the oldest tail
    chunks are dropped while the tail weighs more than its cap. A dropped chunk keeps its seq and source with
    no lines (so a reader resuming from a seq, and exactly-once delivery, see no gap); the latest dropped chunk
    carries one line saying how many lines and bytes were dropped in all. Other events are never dropped."""

    retention: Retention

    @abstractmethod
    def _load_budget(self, run_id: str) -> LogBudget: ...

    @abstractmethod
    def _save_budget(self, run_id: str, budget: LogBudget) -> None: ...

    @abstractmethod
    def _oldest_tail(self, run_id: str) -> pb.RunEvent | None:
        """The run's earliest log chunk still counted in its tail."""

    @abstractmethod
    def _replace(self, event: pb.RunEvent) -> None:
        """Stores `event` in place of the one with its seq, no longer counted in the tail."""

    @abstractmethod
    def _event_at(self, run_id: str, seq: int) -> pb.RunEvent | None: ...

    def _admit(self, event: pb.RunEvent) -> tuple[int, LogBudget | None]:
        """Before `event` is stored: the bytes it counts in its run's tail (0: in the head, or not a log
        chunk), and the budget to `_settle` once it is stored (None when there is nothing to settle)."""
        if event.WhichOneof("payload") != "log_chunk":
            return 0, None
        budget = self._load_budget(event.run_id)
        size = log_bytes(event.log_chunk)
        if not budget.head_closed and budget.head + size <= self.retention.log_head_bytes:
            budget.head += size
            self._save_budget(event.run_id, budget)
            return 0, None
        budget.head_closed = True
        budget.tail += size
        return size, budget

    def _settle(self, run_id: str, budget: LogBudget) -> None:
        """Drops the oldest tail chunks while the tail is over its cap, and moves the note to the gap's end."""
        marker = budget.marker_seq
        while budget.tail > self.retention.log_tail_bytes:
            oldest = self._oldest_tail(run_id)
            if oldest is None:  # nothing left to drop (a budget from before a prune)
                budget.tail = 0
                break
            size = log_bytes(oldest.log_chunk)
            budget.tail -= size
            budget.dropped_lines += len(oldest.log_chunk.lines)
            budget.dropped_bytes += size
            marker = oldest.seq
            oldest.log_chunk.ClearField("lines")
            self._replace(oldest)
        if marker != budget.marker_seq:
            previous = self._event_at(run_id, budget.marker_seq) if budget.marker_seq else None
            if previous is not None:
                previous.log_chunk.ClearField("lines")
                self._replace(previous)
            noted = self._event_at(run_id, marker)
            if noted is not None:
                noted.log_chunk.lines.append(dropped_note(budget, self.retention))
                self._replace(noted)
            budget.marker_seq = marker
        self._save_budget(run_id, budget)


def keep_private(path: Path) -> None:
    """A state file only its owner can read: its folder 0700 (created so; tightened when it is ours and not
    a shared sticky folder like /tmp), the file and SQLite's -wal, -shm and -journal beside it 0600. Called
    before SQLite opens the file: SQLite creates its -wal and -shm with the database's mode."""
    folder = path.parent
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for created in reversed(missing):
        created.mkdir(mode=0o700, exist_ok=True)
    _tighten(path.parent, 0o700)
    if not path.exists():
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    for file in (path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm", "-journal"))):
        if file.exists():
            _tighten(file, 0o600)


def _tighten(path: Path, mode: int) -> None:
    status = path.stat()
    shared = stat.S_ISDIR(status.st_mode) and status.st_mode & stat.S_ISVTX
    if status.st_uid == os.geteuid() and not shared and stat.S_IMODE(status.st_mode) != mode:
        path.chmod(mode)
