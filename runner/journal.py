"""The runner's local event journal: every event of every run, so a bot can replay after a disconnect.

Writes are small and synchronous on the event loop (a few per second at most), in WAL mode. A run's request
is kept redacted, with an HMAC of the request as sent under the redaction key: enough to recognise a retried
StartRun, and no secret rests on the runner's disk, not even as a digest a guess could be checked against.
The journal is its owner's alone: the file 0600 in a 0700 folder (`keep_private`, the bot's store uses it too).
"""

from __future__ import annotations

import os
import sqlite3
import stat
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
"""


class Journal:
    def __init__(self, path: Path) -> None:
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
