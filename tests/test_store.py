from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bot.store import MIGRATIONS, ActiveRunExists, RunNotFound, Store
from protos import runner_pb2 as pb


def _event(run_id: str, seq: int) -> pb.RunEvent:
    return pb.RunEvent(run_id=run_id, seq=seq, stage_started=pb.StageStarted(stage=pb.STAGE_FREEZE))


def test_migrations_apply_once_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "k3.db"
    Store(path).create_run({"id": "r1", "cluster": "a", "status": "running"})
    again = Store(path)
    applied = [row["id"] for row in again.db.table("_migrations").rows]
    assert applied == list(range(1, len(MIGRATIONS) + 1))
    assert again.get_run("r1")["status"] == "running"


def test_an_event_is_stored_once_per_run_and_seq(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    store.create_run({"id": "r1", "cluster": "a", "status": "running"})
    assert store.add_event(_event("r1", 1)) is True
    assert store.add_event(_event("r1", 1)) is False
    assert store.add_event(_event("r1", 2)) is True
    assert [e.seq for e in store.events("r1")] == [1, 2]
    assert store.last_seq("r1") == 2
    with pytest.raises(sqlite3.IntegrityError):  # the schema itself refuses duplicates
        store.db.execute("INSERT INTO run_events (run_id, seq, kind, payload_json) VALUES ('r1', 2, 'x', '{}')")


def test_one_active_run_per_cluster(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    store.create_run({"id": "r1", "cluster": "a", "status": "running"})
    with pytest.raises(ActiveRunExists) as caught:
        store.create_run({"id": "r2", "cluster": "a", "status": "queued"})
    assert caught.value.run_id == "r1"
    store.create_run({"id": "r3", "cluster": "b", "status": "running"})
    store.update_run("r1", status="completed")
    store.create_run({"id": "r4", "cluster": "a", "status": "running"})
    assert {r["id"] for r in store.runs(status=("running",))} == {"r3", "r4"}


def test_runs_are_found_by_unique_prefix(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    store.create_run({"id": "20261130-0900-aa", "cluster": "a", "status": "completed"})
    store.create_run({"id": "20261130-0900-ab", "cluster": "b", "status": "completed"})
    assert store.get_run("20261130-0900-aa")["cluster"] == "a"
    assert store.get_run("20261130-0900-ab")["cluster"] == "b"
    with pytest.raises(RunNotFound, match="ambiguous"):
        store.get_run("20261130-0900-a")
    with pytest.raises(RunNotFound, match="no run"):
        store.get_run("nope")
