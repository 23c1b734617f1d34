from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import bot.store as store_module
from bot.ids import new_run_id
from bot.store import ACTIVE, MIGRATIONS, ActiveRunExists, RunNotFound, RunState, Store
from protos import runner_pb2 as pb
from protos.vocab import Decision, RunStatus


def _event(run_id: str, seq: int) -> pb.RunEvent:
    return pb.RunEvent(run_id=run_id, seq=seq, stage_started=pb.StageStarted(stage=pb.STAGE_FREEZE))


def test_migrations_apply_once_and_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "k3.db"
    Store(path).create_run("r1", "a")
    again = Store(path)
    applied = [row["id"] for row in again.db.table("_migrations").rows]
    assert applied == list(range(1, len(MIGRATIONS) + 1))
    assert again.get_run("r1").status == "running"


def test_a_store_from_before_migration_6_keeps_its_runs_and_one_running_run_per_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 6 rebuilds the one-active-run index on 'running' alone (1 and 4 also named 'queued')."""
    path = tmp_path / "k3.db"
    with monkeypatch.context() as old:
        old.setattr(store_module, "MIGRATIONS", MIGRATIONS[:5])
        Store(path).create_run("r1", "a")
    store = Store(path)
    assert store.get_run("r1").status == "running"
    with pytest.raises(ActiveRunExists):
        store.create_run("r2", "a")
    store.db.execute("UPDATE runs SET status = 'queued' WHERE id = 'r1'")  # a status no code writes
    store.create_run("r3", "a")
    assert [run.id for run in store.active_runs()] == ["r3"]


def test_an_event_is_stored_once_per_run_and_seq(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    store.create_run("r1", "a")
    assert store.add_event(_event("r1", 1)) is not None
    assert store.add_event(_event("r1", 1)) is None
    assert store.add_event(_event("r1", 2)) is not None
    assert [e.seq for e in store.events("r1")] == [1, 2]
    assert store.last_seq("r1") == 2
    with pytest.raises(sqlite3.IntegrityError):  # the schema itself refuses duplicates
        store.db.execute("INSERT INTO run_events (run_id, seq, kind, payload_json) VALUES ('r1', 2, 'x', '{}')")


def test_one_active_run_per_cluster(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    store.create_run("r1", "a")
    with pytest.raises(ActiveRunExists) as caught:
        store.create_run("r2", "a")
    assert caught.value.run_id == "r1"
    store.create_run("r3", "b")
    store.finish_run("r1", "completed")
    store.create_run("r4", "a")
    assert {r.id for r in store.runs(status=ACTIVE)} == {"r3", "r4"}


def test_statuses_are_stored_as_their_ids_and_read_back_as_members(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    store.create_run("r1", "a")
    store.finish_run("r1", RunState.COMPLETED, "done", Decision.ISOLATE)
    stored = store.db.execute("SELECT status, typeof(status), decision, typeof(decision) FROM runs").fetchone()
    assert stored == ("completed", "text", "isolate", "text")  # the same strings as before the enums
    run = store.get_run("r1")
    assert run.status is RunState.COMPLETED and run.decision is Decision.ISOLATE
    # the store's status is the wire's RunStatus ids and its own two
    assert {s.value for s in RunState} - {s.value for s in RunStatus} == {"running", "lost"}
    assert {s.value for s in RunStatus} <= {s.value for s in RunState}


def test_runs_are_found_by_unique_prefix(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    store.create_run("20261130-0900-aa", "a")
    store.create_run("20261130-0900-ab", "b")
    assert store.get_run("20261130-0900-aa").cluster == "a"
    assert store.get_run("20261130-0900-ab").cluster == "b"
    with pytest.raises(RunNotFound, match="ambiguous"):
        store.get_run("20261130-0900-a")
    with pytest.raises(RunNotFound, match="no run"):
        store.get_run("nope")


def test_run_ids_of_one_second_do_not_collide() -> None:
    ids = [new_run_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids) and all(len(i.rsplit("-", 1)[1]) == 8 for i in ids)


async def test_what_the_bot_shows_of_an_event_is_what_its_store_keeps_redacted(tmp_path: Path) -> None:
    """A runner that let a secret through (an older or misconfigured one): the event the consumer hands to
    Slack and the terminal is the store's redacted copy, not the one off the wire."""
    from bot.consumer import _consume
    from bot.store import AsyncStore

    token = "hf_" + "aB3" * 10
    leaked = pb.RunEvent(run_id="r1", seq=1, log_chunk=pb.LogChunk(source="engine", lines=[f"HF_TOKEN={token}"]))
    finished = pb.RunEvent(run_id="r1", seq=2, run_finished=pb.RunFinished(status=pb.RUN_STATUS_COMPLETED))
    store = AsyncStore(tmp_path / "k3.db")
    await store.call(Store.create_run, "r1", "c", runner="127.0.0.1:1", requested_by="U1", image="i", request_json="{}")

    async def events():  # type: ignore[no-untyped-def]
        yield leaked
        yield finished

    shown: list[pb.RunEvent] = []

    async def on_event(event: pb.RunEvent) -> None:
        shown.append(event)

    await _consume(store, "r1", events(), on_event, lambda: None)
    stored = await store.call(Store.events, "r1")
    store.close()
    assert [event.seq for event in shown] == [1, 2]
    assert token not in str(shown[0]) and token not in str(stored[0])
    assert shown[0].log_chunk.lines == stored[0].log_chunk.lines
