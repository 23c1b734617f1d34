"""State files are their owner's alone, and the journal keeps no digest a guess can be checked against: the
runner's journal and the bot's store are 0600 (SQLite's -wal and -shm too) in 0700 folders, created so or
tightened when they were world-readable; a shared sticky folder such as /tmp is left as it is; the request's
digest is an HMAC under the redaction key, and a journal written with plain sha256s loses them."""

from __future__ import annotations

import hashlib
import sqlite3
import stat
from pathlib import Path

from bot.store import Store
from kernel.redact import redactor
from protos import runner_pb2 as pb
from runner.journal import Journal, request_digest

REQUEST = pb.StartRunRequest(run_id="r1", cluster="c", launch_argv=["vllm", "serve", "m", "--api-key", "Guess1234"])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _journal(path: Path) -> Journal:
    journal = Journal(path)
    journal.add_run(REQUEST)
    journal.append(pb.RunEvent(run_id="r1", seq=1, heartbeat=pb.Heartbeat()))
    return journal


def test_the_journal_and_its_folder_are_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)  # as the daemon's lock creates it
    state.chmod(0o755)
    journal = _journal(state / "journal.sqlite")
    try:
        assert _mode(state) == 0o700
        files = sorted(p.name for p in state.iterdir())
        assert {"journal.sqlite", "journal.sqlite-wal", "journal.sqlite-shm"} <= set(files)
        assert {name: _mode(state / name) for name in files} == dict.fromkeys(files, 0o600)
    finally:
        journal.close()


def test_a_world_readable_journal_is_tightened_and_a_new_folder_made_private(tmp_path: Path) -> None:
    old = tmp_path / "old" / "journal.sqlite"
    _journal(old).close()
    for path in (old.parent, old):
        path.chmod(0o777 if path.is_dir() else 0o644)
    _journal(tmp_path / "new" / "deeper" / "journal.sqlite").close()
    Journal(old).close()
    assert _mode(old.parent) == 0o700 and _mode(old) == 0o600
    assert _mode(tmp_path / "new") == _mode(tmp_path / "new" / "deeper") == 0o700


def test_a_shared_sticky_folder_is_left_alone_but_the_file_is_private(tmp_path: Path) -> None:
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    Journal(shared / "journal.sqlite").close()
    assert _mode(shared) == 0o1777 and _mode(shared / "journal.sqlite") == 0o600


def test_the_bot_store_and_its_folder_are_private(tmp_path: Path) -> None:
    folder = tmp_path / "k3"
    folder.mkdir()
    folder.chmod(0o755)
    store = Store(folder / "k3.db")
    try:
        assert _mode(folder) == 0o700
        assert {p.name: _mode(p) for p in folder.iterdir()} == {p.name: 0o600 for p in folder.iterdir()}
        assert (folder / "k3.db").exists()
    finally:
        store.close()


def test_the_request_digest_is_keyed_and_old_plain_digests_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "state" / "journal.sqlite"
    plain = hashlib.sha256(REQUEST.SerializeToString(deterministic=True)).hexdigest()
    journal = _journal(path)
    try:
        stored = journal.request_sha256("r1")
        assert stored == request_digest(REQUEST) == redactor().digest(REQUEST.SerializeToString(deterministic=True))
        assert stored != plain
        other = pb.StartRunRequest(run_id="r1", cluster="c", launch_argv=["vllm", "serve", "m", "--api-key", "Guess0"])
        assert request_digest(other) != stored  # a changed request is still told apart
    finally:
        journal.close()
    assert plain.encode() not in b"".join(p.read_bytes() for p in path.parent.iterdir())

    # a journal from before: a plain sha256 in request_sha256, no request_hmac column
    old = tmp_path / "old" / "journal.sqlite"
    old.parent.mkdir()
    with sqlite3.connect(old) as db:
        db.execute(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, request BLOB NOT NULL, "
            "request_sha256 TEXT NOT NULL DEFAULT '', started_at TEXT NOT NULL, finished_at TEXT)"
        )
        db.execute("INSERT INTO runs VALUES ('r0', x'', ?, 'now', 'then')", (plain,))
    db.close()
    journal = Journal(old)
    try:
        assert journal.request_sha256("r0") == ""  # no retry of it is recognised; nothing can be confirmed
        assert journal.request("r0") is not None
    finally:
        journal.close()
    assert plain.encode() not in b"".join(p.read_bytes() for p in old.parent.iterdir())
