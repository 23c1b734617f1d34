"""One migration style for the SQLite files (kernel/migrations.py): the runner's journal is numbered like the
bot's store, and a journal written by the code before keeps its runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from kernel.migrations import migrate
from protos import runner_pb2 as pb
from runner.journal import MIGRATIONS, Journal

# The journal as the code before numbered migrations left it: its CREATE IF NOT EXISTS script, then its ALTER.
PREVIOUS = """
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
ALTER TABLE events ADD COLUMN tail_bytes INTEGER NOT NULL DEFAULT 0;
"""

# The journal's first version: no digest, no log budgets.
FIRST = """
CREATE TABLE runs (run_id TEXT PRIMARY KEY, request BLOB NOT NULL, started_at TEXT NOT NULL, finished_at TEXT);
CREATE TABLE events (
    run_id TEXT NOT NULL REFERENCES runs(run_id), seq INTEGER NOT NULL, event BLOB NOT NULL, PRIMARY KEY (run_id, seq)
);
"""


def _event(run_id: str, seq: int) -> pb.RunEvent:
    return pb.RunEvent(run_id=run_id, seq=seq, heartbeat=pb.Heartbeat())


def _old_journal(path: Path, script: str) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(script)
        db.execute(
            "INSERT INTO runs (run_id, request, started_at) VALUES ('r0', ?, '2026-12-01T00:00:00.000+00:00')",
            (pb.StartRunRequest(run_id="r0", cluster="c").SerializeToString(),),
        )
        for seq in (1, 2):
            db.execute(
                "INSERT INTO events (run_id, seq, event) VALUES ('r0', ?, ?)",
                (seq, _event("r0", seq).SerializeToString()),
            )
    db.close()


def _recorded(path: Path) -> list[tuple[int, str]]:
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT id, name FROM _migrations ORDER BY id").fetchall()
    db.close()
    return rows


@pytest.mark.parametrize("script", [PREVIOUS, FIRST], ids=["previous", "first"])
def test_a_journal_from_before_numbered_migrations_keeps_its_runs(tmp_path: Path, script: str) -> None:
    path = tmp_path / "journal.sqlite"
    _old_journal(path, script)
    journal = Journal(path)
    try:
        assert journal.unfinished_runs() == ["r0"]
        assert [event.seq for event in journal.events("r0", 0)] == [1, 2]
        assert journal.request("r0") == pb.StartRunRequest(run_id="r0", cluster="c")
        assert journal.request_sha256("r0") == ""
        journal.append(_event("r0", 3))  # today's columns are there (tail_bytes, log_budgets)
        journal.add_run(pb.StartRunRequest(run_id="r1", cluster="c"))
        assert journal.last_seq("r0") == 3
    finally:
        journal.close()
    assert _recorded(path) == [(number, name) for number, (name, _) in enumerate(MIGRATIONS, start=1)]
    Journal(path).close()  # reopened: nothing left to apply
    assert len(_recorded(path)) == len(MIGRATIONS)


def test_a_failing_migration_leaves_neither_its_change_nor_its_record(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "f.sqlite", isolation_level=None)  # autocommit, as the journal's

    def fails(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half (x INTEGER)")
        raise sqlite3.OperationalError("disk full")

    def creates(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE whole (x INTEGER)")

    first = ("first", creates)
    with pytest.raises(sqlite3.OperationalError):
        migrate(db, [first, ("second", fails)], db)
    tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == {"_migrations", "whole"}
    assert db.execute("SELECT id FROM _migrations").fetchall() == [(1,)]
    assert migrate(db, [first, ("second", lambda conn: conn.execute("CREATE TABLE half (x INTEGER)"))], db) == [2]
    db.close()
