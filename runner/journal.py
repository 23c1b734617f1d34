"""The runner's local event journal: every event of every run, so a bot can replay after a disconnect.

Writes are small and synchronous on the event loop (a few per second at most), in WAL mode. A run's request
is kept redacted, with an HMAC of the request as sent under the redaction key: enough to recognise a retried
StartRun, and no secret rests on the runner's disk, not even as a digest a guess could be checked against.
The journal is its owner's alone: the file 0600 in a 0700 folder (`keep_private`, the bot's store uses it too).

What a run keeps is bounded (`Retention`, shared with the bot's store): its log lines up to a head and a rolling
tail (`CappedLog`; a dropped chunk keeps its seq, emptied, and one chunk at the gap says how much went), every
other event whole; finished runs go after `retention_days`, at open and daily.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from protos import runner_pb2 as pb
from runner.redact import redactor
from runner.toml_reader import ConfigError, TomlReader

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    request BLOB NOT NULL,
    request_sha256 TEXT NOT NULL DEFAULT '',
    request_hmac TEXT NOT NULL DEFAULT '',
    started_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS log_budgets (
    run_id TEXT PRIMARY KEY,
    head INTEGER NOT NULL DEFAULT 0,
    head_closed INTEGER NOT NULL DEFAULT 0,
    tail INTEGER NOT NULL DEFAULT 0,
    dropped_lines INTEGER NOT NULL DEFAULT 0,
    dropped_bytes INTEGER NOT NULL DEFAULT 0,
    marker_seq INTEGER NOT NULL DEFAULT 0
);
"""
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
        return (datetime.now(UTC) - timedelta(days=self.retention_days)).isoformat(timespec="milliseconds")


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


class Journal(CappedLog):
    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        self.retention = retention or Retention()
        keep_private(path)
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        if "request_sha256" not in columns:  # a journal written before requests were kept redacted
            self._db.execute("ALTER TABLE runs ADD COLUMN request_sha256 TEXT NOT NULL DEFAULT ''")
        if "request_hmac" not in columns:  # before the digest was keyed: the plain sha256s go, overwritten
            self._db.execute("ALTER TABLE runs ADD COLUMN request_hmac TEXT NOT NULL DEFAULT ''")
            self._db.execute("PRAGMA secure_delete=ON")
            self._db.execute("UPDATE runs SET request_sha256 = '' WHERE request_sha256 != ''")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        if "tail_bytes" not in {row[1] for row in self._db.execute("PRAGMA table_info(events)")}:
            self._db.execute("ALTER TABLE events ADD COLUMN tail_bytes INTEGER NOT NULL DEFAULT 0")
        self._pruned_at = 0.0
        self.prune()

    def close(self) -> None:
        self._db.close()

    def add_run(self, request: pb.StartRunRequest) -> None:
        self._db.execute(
            "INSERT INTO runs (run_id, request, request_hmac, started_at) VALUES (?, ?, ?, ?)",
            (request.run_id, redactor().message(request).SerializeToString(), request_digest(request), _now()),
        )

    def request(self, run_id: str) -> pb.StartRunRequest | None:
        """The run's request, redacted; None for a run this runner never had."""
        row = self._db.execute("SELECT request FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else pb.StartRunRequest.FromString(row[0])

    def request_sha256(self, run_id: str) -> str | None:
        """The keyed digest of the run's request as it was sent (see `request_digest`); None for an unknown
        run, '' for one journaled before the digest was keyed."""
        row = self._db.execute("SELECT request_hmac FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else str(row[0])

    def append(self, event: pb.RunEvent) -> None:
        with self._db:
            tail, budget = self._admit(event)
            self._db.execute(
                "INSERT INTO events (run_id, seq, event, tail_bytes) VALUES (?, ?, ?, ?)",
                (event.run_id, event.seq, event.SerializeToString(), tail),
            )
            if budget is not None:
                self._settle(event.run_id, budget)
            if event.WhichOneof("payload") == "run_finished":
                self._db.execute("UPDATE runs SET finished_at = ? WHERE run_id = ?", (_now(), event.run_id))
        if time.monotonic() - self._pruned_at >= DAY_S:
            self.prune()

    def prune(self) -> int:
        """Forgets the runs that finished more than `retention_days` ago (their events and log budget too);
        done at open and at most daily after. Returns how many runs went."""
        self._pruned_at = time.monotonic()
        cutoff = self.retention.cutoff()
        if cutoff is None:
            return 0
        with self._db:
            for table in ("events", "log_budgets"):  # literal table names
                self._db.execute(
                    "DELETE FROM " + table + " WHERE run_id IN (SELECT run_id FROM runs"  # noqa: S608
                    " WHERE finished_at IS NOT NULL AND finished_at < ?)",
                    (cutoff,),
                )
            sql = "DELETE FROM runs WHERE finished_at IS NOT NULL AND finished_at < ?"
            return self._db.execute(sql, (cutoff,)).rowcount

    # --- CappedLog's storage ---

    def _load_budget(self, run_id: str) -> LogBudget:
        row = self._db.execute(
            "SELECT head, head_closed, tail, dropped_lines, dropped_bytes, marker_seq FROM log_budgets WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        return LogBudget() if row is None else LogBudget(row[0], bool(row[1]), *row[2:])

    def _save_budget(self, run_id: str, budget: LogBudget) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO log_budgets (run_id, head, head_closed, tail, dropped_lines, dropped_bytes,"
            " marker_seq) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                budget.head,
                int(budget.head_closed),
                budget.tail,
                budget.dropped_lines,
                budget.dropped_bytes,
                budget.marker_seq,
            ),
        )

    def _oldest_tail(self, run_id: str) -> pb.RunEvent | None:
        row = self._db.execute(
            "SELECT event FROM events WHERE run_id = ? AND tail_bytes > 0 ORDER BY seq LIMIT 1", (run_id,)
        ).fetchone()
        return None if row is None else pb.RunEvent.FromString(row[0])

    def _replace(self, event: pb.RunEvent) -> None:
        self._db.execute(
            "UPDATE events SET event = ?, tail_bytes = 0 WHERE run_id = ? AND seq = ?",
            (event.SerializeToString(), event.run_id, event.seq),
        )

    def _event_at(self, run_id: str, seq: int) -> pb.RunEvent | None:
        row = self._db.execute("SELECT event FROM events WHERE run_id = ? AND seq = ?", (run_id, seq)).fetchone()
        return None if row is None else pb.RunEvent.FromString(row[0])

    def last_seq(self, run_id: str) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM events WHERE run_id = ?", (run_id,)).fetchone()
        return int(row[0] or 0)

    def events(self, run_id: str, after_seq: int) -> Iterator[pb.RunEvent]:
        rows = self._db.execute(
            "SELECT event FROM events WHERE run_id = ? AND seq > ? ORDER BY seq", (run_id, after_seq)
        ).fetchall()
        for (blob,) in rows:
            yield pb.RunEvent.FromString(blob)

    def last_event(self, run_id: str) -> pb.RunEvent | None:
        row = self._db.execute(
            "SELECT event FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1", (run_id,)
        ).fetchone()
        return None if row is None else pb.RunEvent.FromString(row[0])

    def is_finished(self, run_id: str) -> bool:
        row = self._db.execute("SELECT finished_at FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return row is not None and row[0] is not None

    def unfinished_runs(self) -> list[str]:
        rows = self._db.execute("SELECT run_id FROM runs WHERE finished_at IS NULL").fetchall()
        return [row[0] for row in rows]


def request_digest(request: pb.StartRunRequest) -> str:
    """Identifies a request without keeping it: HMAC-SHA256 under the redaction key (K3REPRO_REDACTION_KEY,
    else random per process) of its deterministic serialisation, so a retry hashes the same and a reader of
    the journal cannot confirm a guessed secret. A runner restarted without that key set recognises no
    retry of a run from before the restart (the retry is refused as a different request)."""
    return redactor().digest(request.SerializeToString(deterministic=True))


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


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
