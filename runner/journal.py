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

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

from kernel.clock import WALL
from kernel.migrations import migrate
from kernel.redact import redactor
from kernel.retention import DAY_S, CappedLog, LogBudget, Retention, keep_private
from protos import runner_pb2 as pb


def _add_column(db: sqlite3.Connection, table: str, column: str, declaration: str) -> bool:
    """Adds a column that a journal from before the numbered migrations may already have (its ad-hoc ALTERs);
    True when it was added now."""
    if column in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
        return False
    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
    return True


def _m1_initial(db: sqlite3.Connection) -> None:
    db.execute(
        "CREATE TABLE IF NOT EXISTS runs ("
        " run_id TEXT PRIMARY KEY, request BLOB NOT NULL, started_at TEXT NOT NULL, finished_at TEXT)"
    )
    db.execute(
        "CREATE TABLE IF NOT EXISTS events ("
        " run_id TEXT NOT NULL REFERENCES runs(run_id), seq INTEGER NOT NULL, event BLOB NOT NULL,"
        " PRIMARY KEY (run_id, seq))"
    )


def _m2_redacted_requests(db: sqlite3.Connection) -> None:
    """Requests kept redacted, with a digest of the request as sent."""
    _add_column(db, "runs", "request_sha256", "TEXT NOT NULL DEFAULT ''")


def _m3_keyed_digests(db: sqlite3.Connection) -> None:
    """The digest keyed (an HMAC under the redaction key): the plain sha256s go, overwritten (secure_delete,
    then the WAL checkpointed once the migrations are done)."""
    if _add_column(db, "runs", "request_hmac", "TEXT NOT NULL DEFAULT ''"):
        db.execute("PRAGMA secure_delete=ON")
        db.execute("UPDATE runs SET request_sha256 = '' WHERE request_sha256 != ''")


def _m4_log_budgets(db: sqlite3.Connection) -> None:
    """Per-run caps on log lines kept (CappedLog): a log chunk's bytes still counted in its run's rolling tail,
    and each run's budget."""
    _add_column(db, "events", "tail_bytes", "INTEGER NOT NULL DEFAULT 0")
    db.execute(
        "CREATE TABLE IF NOT EXISTS log_budgets ("
        " run_id TEXT PRIMARY KEY, head INTEGER NOT NULL DEFAULT 0, head_closed INTEGER NOT NULL DEFAULT 0,"
        " tail INTEGER NOT NULL DEFAULT 0, dropped_lines INTEGER NOT NULL DEFAULT 0,"
        " dropped_bytes INTEGER NOT NULL DEFAULT 0, marker_seq INTEGER NOT NULL DEFAULT 0)"
    )


# The journal's schema, as the migrations that made it (kernel/migrations.py, the bot's store's style). A journal
# written before they were numbered has no _migrations: each of them finds what it adds perhaps already there.
MIGRATIONS: tuple[tuple[str, Callable[[sqlite3.Connection], None]], ...] = (
    ("initial", _m1_initial),
    ("redacted_requests", _m2_redacted_requests),
    ("keyed_digests", _m3_keyed_digests),
    ("log_budgets", _m4_log_budgets),
)


class Journal(CappedLog):
    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        self.retention = retention or Retention()
        keep_private(path)
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        if migrate(self._db, MIGRATIONS, self._db):  # what a migration overwrote leaves no copy in the WAL
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
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
        if WALL.monotonic() - self._pruned_at >= DAY_S:
            self.prune()

    def prune(self) -> int:
        """Forgets the runs that finished more than `retention_days` ago (their events and log budget too);
        done at open and at most daily after. Returns how many runs went."""
        self._pruned_at = WALL.monotonic()
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


def _now() -> str:
    return WALL.stamp()
