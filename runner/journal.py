"""The runner's local event journal: every event of every run, so a bot can replay after a disconnect.

Writes are small and synchronous on the event loop (a few per second at most), in WAL mode. A run's request
is kept redacted, with the sha256 of the request as sent: enough to recognise a retried StartRun, and no
secret rests on the runner's disk.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from protos import runner_pb2 as pb
from runner.redact import redactor

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    request BLOB NOT NULL,
    request_sha256 TEXT NOT NULL DEFAULT '',
    started_at TEXT NOT NULL,
    finished_at TEXT
);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seq INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"""


class Journal:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(runs)")}
        if "request_sha256" not in columns:  # a journal written before requests were kept redacted
            self._db.execute("ALTER TABLE runs ADD COLUMN request_sha256 TEXT NOT NULL DEFAULT ''")

    def close(self) -> None:
        self._db.close()

    def add_run(self, request: pb.StartRunRequest) -> None:
        self._db.execute(
            "INSERT INTO runs (run_id, request, request_sha256, started_at) VALUES (?, ?, ?, ?)",
            (request.run_id, redactor().message(request).SerializeToString(), request_digest(request), _now()),
        )

    def request(self, run_id: str) -> pb.StartRunRequest | None:
        """The run's request, redacted; None for a run this runner never had."""
        row = self._db.execute("SELECT request FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else pb.StartRunRequest.FromString(row[0])

    def request_sha256(self, run_id: str) -> str | None:
        """The digest of the run's request as it was sent (see `request_digest`); None for an unknown run."""
        row = self._db.execute("SELECT request_sha256 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else str(row[0])

    def append(self, event: pb.RunEvent) -> None:
        with self._db:
            self._db.execute(
                "INSERT INTO events (run_id, seq, event) VALUES (?, ?, ?)",
                (event.run_id, event.seq, event.SerializeToString()),
            )
            if event.WhichOneof("payload") == "run_finished":
                self._db.execute("UPDATE runs SET finished_at = ? WHERE run_id = ?", (_now(), event.run_id))

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
    """Identifies a request without keeping it: deterministic serialisation, so a retry hashes the same."""
    return hashlib.sha256(request.SerializeToString(deterministic=True)).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
