"""A corpus of hostile bundles, each sealed the way an attacker would (the manifest's hashes recomputed, so only
validation stands in the way): every one is refused with one line and leaves the store as it was, or is
imported under the bundle's own identity, never active, never into another run, its text made harmless."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
from collections.abc import Callable
from dataclasses import asdict
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from bot.bundle import MANIFEST, BundleError, export_bundle, import_bundle, parse_bundle, read_bundle
from bot.cli import main
from bot.store import FINAL, Store
from tests.test_bundle import _store

RUN = "20261130-090000-abcd"
Members = dict[str, bytes]


def _members(tmp_path: Path) -> tuple[dict[str, Any], Members]:
    made = export_bundle(_store(tmp_path / "source.db"), RUN)
    return json.loads(json.dumps(made.manifest)), dict(made.members)


def _sealed(manifest: dict[str, Any], members: Members, extra: list[tarfile.TarInfo] | None = None) -> bytes:
    """A tar.gz whose manifest lists exactly `members` with their real hashes."""
    manifest = {
        **manifest,
        "members": {n: {"sha256": sha256(d).hexdigest(), "bytes": len(d)} for n, d in members.items()},
    }
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in ((MANIFEST, json.dumps(manifest).encode()), *members.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info)
    return raw.getvalue()


def _edit(name: str, change: Callable[[Any], Any]) -> Callable[[dict[str, Any], Members], bytes]:
    def craft(manifest: dict[str, Any], members: Members) -> bytes:
        return _sealed(manifest, {**members, name: json.dumps(change(json.loads(members[name]))).encode()})

    return craft


def _events(
    change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> Callable[[dict[str, Any], Members], bytes]:
    def craft(manifest: dict[str, Any], members: Members) -> bytes:
        events = [json.loads(line) for line in members["events.jsonl"].decode().splitlines()]
        text = "".join(json.dumps(e) + "\n" for e in change(events))
        return _sealed(manifest, {**members, "events.jsonl": text.encode()})

    return craft


def _raw(data: bytes) -> Callable[[dict[str, Any], Members], bytes]:
    return lambda manifest, members: data


def _gz(payload: bytes) -> bytes:
    return gzip.compress(payload)


def _tar_with(*infos: tuple[str, bytes, bytes]) -> Callable[[dict[str, Any], Members], bytes]:
    """Members of other kinds than a bundle has: (name, type, data)."""

    def craft(manifest: dict[str, Any], members: Members) -> bytes:
        extra = []
        for name, kind, target in infos:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = target.decode()
            extra.append(info)
        return _sealed(manifest, members, extra)

    return craft


def _many_members(count: int) -> Callable[[dict[str, Any], Members], bytes]:
    def craft(manifest: dict[str, Any], members: Members) -> bytes:
        raw = io.BytesIO()
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for n in range(count):
                tar.addfile(tarfile.TarInfo(f"m{n}"), io.BytesIO(b""))
        return raw.getvalue()

    return craft


def _bomb(manifest: dict[str, Any], members: Members) -> bytes:
    """300 MiB of zeros in one member: a few hundred KiB compressed."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9) as gz:
        info = tarfile.TarInfo("logs/huge.log")
        info.size = 300 * 2**20
        gz.write(info.tobuf())
        zeros = b"\0" * 2**20
        for _ in range(300):
            gz.write(zeros)
    return raw.getvalue()


def _deep_json(manifest: dict[str, Any], members: Members) -> bytes:
    return _sealed(manifest, {**members, "launch.json": b"[" * 100_000 + b"]" * 100_000})


def _renamed(name: str) -> Callable[[dict[str, Any], Members], bytes]:
    return lambda manifest, members: _sealed(manifest, {**members, name: b"x"})


def _manifest(change: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any], Members], bytes]:
    def craft(manifest: dict[str, Any], members: Members) -> bytes:
        manifest = change(json.loads(json.dumps(manifest)))
        raw = io.BytesIO()
        with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for name, data in ((MANIFEST, json.dumps(manifest).encode()), *members.items()):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return raw.getvalue()

    return craft


def _without(name: str) -> Callable[[dict[str, Any], Members], bytes]:
    return lambda manifest, members: _sealed(manifest, {k: v for k, v in members.items() if k != name})


REFUSED: dict[str, tuple[Callable[[dict[str, Any], Members], bytes], str]] = {
    "status running (would block its cluster)": (
        _edit("run.json", lambda r: {**r, "status": "running"}),
        "status must be",
    ),
    "status queued": (_edit("run.json", lambda r: {**r, "status": "queued"}), "status must be"),
    "run id null": (_edit("run.json", lambda r: {**r, "id": None}), "run.json's id is not the manifest's"),
    "run id of another run": (_edit("run.json", lambda r: {**r, "id": "victim"}), "run.json's id is not"),
    "run.json a list": (_edit("run.json", lambda r: [r]), "run.json is not an object"),
    "cluster a number": (_edit("run.json", lambda r: {**r, "cluster": 7}), "cluster must be a name"),
    "decision injected": (_edit("run.json", lambda r: {**r, "decision": "fix · INJECTED"}), "decision is not"),
    "summary a dict": (_edit("run.json", lambda r: {**r, "summary": {"a": 1}}), "summary/image not text"),
    "argv a string": (_edit("launch.json", lambda r: {**r, "argv": "rm -rf /"}), "argv must be strings"),
    "argv with numbers": (_edit("launch.json", lambda r: {**r, "argv": ["vllm", 1]}), "argv must be strings"),
    "launch.json null": (_edit("launch.json", lambda r: None), "launch.json is not an object"),
    "image missing": (_edit("launch.json", lambda r: {k: v for k, v in r.items() if k != "image"}), "image must be"),
    "api shell": (_edit("request.json", lambda r: {**r, "api": "shell"}), "api must be one of"),
    "repeats a string": (_edit("request.json", lambda r: {**r, "repeats": "3"}), "repeats must be"),
    "repeats a million": (_edit("request.json", lambda r: {**r, "repeats": 10**6}), "repeats must be"),
    "repeats true": (_edit("request.json", lambda r: {**r, "repeats": True}), "repeats must be"),
    "no body, bad digest": (_edit("request.json", lambda r: {"api": "chat", "repeats": 3, "body_sha256": "x"}), "body"),
    "fingerprint a list": (_edit("fingerprint.json", lambda r: [1]), "fingerprint.json is not an object"),
    "event garbage line": (_events(lambda es: [*es, "not an event"]), "not valid JSON"),  # type: ignore[list-item]
    "event unknown field": (_events(lambda es: [*es, {"seq": 99, "evil": 1}]), "not valid JSON"),
    "duplicate seq": (_events(lambda es: [*es, es[-1]]), "seqs must rise"),
    "seq zero": (_events(lambda es: [{**es[0], "seq": 0}, *es[1:]]), "seqs must rise"),
    "seqs backwards": (_events(lambda es: list(reversed(es))), "seqs must rise"),
    "heartbeat event": (_events(lambda es: [*es, {"seq": 99, "heartbeat": {"lastSeq": 1}}]), "an empty event"),
    "empty event": (_events(lambda es: [*es, {"seq": 99}]), "an empty event"),
    "events not UTF-8": (
        lambda m, ms: _sealed(m, {**ms, "events.jsonl": b"\xff\xfe\n"}),
        "not valid JSON",
    ),
    "deeply nested JSON": (_deep_json, "not valid JSON"),
    "path traversal": (_renamed("../../etc/cron.d/evil"), "is not one a bundle has"),
    "absolute path": (_renamed("/etc/passwd"), "is not one a bundle has"),
    "too deep": (_renamed("logs/a/b/c.log"), "is not one a bundle has"),
    "ANSI in a member name": (_renamed("logs/\x1b[2Jx.log"), "is not one a bundle has"),
    "symlink member": (_tar_with(("logs/link.log", tarfile.SYMTYPE, b"/etc/shadow")), "is not a regular file"),
    "hard link member": (_tar_with(("logs/hard.log", tarfile.LNKTYPE, b"run.json")), "is not a regular file"),
    "directory member": (_tar_with(("logs", tarfile.DIRTYPE, b"")), "is not a regular file"),
    "device member": (_tar_with(("logs/zero", tarfile.CHRTYPE, b"")), "is not a regular file"),
    "fifo member": (_tar_with(("logs/fifo", tarfile.FIFOTYPE, b"")), "is not a regular file"),
    "20,000 members": (_many_members(20_000), "over 512 members"),
    "gzip bomb": (_bomb, "unpacks to over 256 MiB"),
    "not gzip": (_raw(b"PK\x03\x04 a zip file"), "truncated or not a k3repro bundle"),
    "empty file": (_raw(b""), "truncated or not a k3repro bundle"),
    "gzip of garbage": (_raw(_gz(b"garbage" * 100)), "truncated or not a k3repro bundle"),
    "empty tar": (_raw(_gz(b"\0" * 1024)), "no manifest.json"),
    "manifest format 2": (_manifest(lambda m: {**m, "format": 2}), "bundle format '2'"),
    "manifest members a list": (_manifest(lambda m: {**m, "members": []}), "the manifest is malformed"),
    "manifest member sizes as text": (
        _manifest(lambda m: {**m, "members": {k: {**v, "bytes": str(v["bytes"])} for k, v in m["members"].items()}}),
        "the manifest is malformed",
    ),
    "manifest run_id with ANSI": (
        _manifest(lambda m: {**m, "run_id": "\x1b]0;pwned\x07"}),
        "the manifest is malformed",
    ),
    "manifest run_id null": (_manifest(lambda m: {**m, "run_id": None}), "the manifest is malformed"),
    "manifest a list": (_manifest(lambda m: [m]), "the manifest is malformed"),  # type: ignore[arg-type,return-value]
    "no run.json": (_without("run.json"), "no run.json"),
    "no events": (_without("events.jsonl"), "no events.jsonl"),
}


def _state(store: Store) -> tuple[list[dict[str, Any]], list[Any]]:
    runs = sorted(store.db.table("runs").rows, key=lambda r: r["id"])
    events = sorted(store.db.execute("SELECT run_id, seq, payload_json FROM run_events").fetchall())
    return runs, events


@pytest.fixture
def target(tmp_path: Path) -> Store:
    """A store with a run of its own, the victim every crafted bundle would like to write into."""
    store = _store(tmp_path / "target.db", run_id="victim")
    store.finish_run("victim", "completed", "the victim's own summary", "continue")
    return store


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_hostile_bundle_is_refused_with_one_line_and_changes_nothing(
    tmp_path: Path, target: Store, case: str
) -> None:
    craft, expected = REFUSED[case]
    manifest, members = _members(tmp_path)
    data = craft(manifest, members)
    before = _state(target)
    started = time.monotonic()
    with pytest.raises(BundleError) as caught:
        import_bundle(target, parse_bundle(data, "b.tar.gz"))
    message = str(caught.value)
    assert expected in message, message
    assert "\n" not in message and "\x1b" not in message
    assert time.monotonic() - started < 10  # the limits count what is read, so a bomb costs little
    assert _state(target) == before


def test_events_carry_no_run_id_of_their_own_into_another_run(tmp_path: Path, target: Store) -> None:
    manifest, members = _members(tmp_path)
    injected = {
        "seq": 100,
        "runId": "victim",
        "runFinished": {"status": "RUN_STATUS_COMPLETED", "decision": "DECISION_FIX", "summary": "INJECTED"},
    }
    data = _events(lambda es: [*es, injected])(manifest, members)
    victim_before = target.events("victim")
    row = import_bundle(target, parse_bundle(data))
    assert row.id == RUN and target.events("victim") == victim_before
    assert target.get_run("victim").summary == "the victim's own summary"
    assert {e.run_id for e in target.events(RUN)} == {RUN}


def test_rerun_of_and_other_columns_of_run_json_are_not_taken(tmp_path: Path, target: Store) -> None:
    manifest, members = _members(tmp_path)
    extra = {"rerun_of": "victim", "runner": "10.0.0.66:50051", "requested_by": "admin", "thread_ts": "1.2"}
    row = import_bundle(target, parse_bundle(_edit("run.json", lambda r: {**r, **extra})(manifest, members)))
    stored = target.get_run(row.id)
    assert stored.rerun_of is None and stored.runner.startswith("bundle:") and stored.thread_ts is None
    assert stored.status in FINAL and target.active_run("cluster-a") is None


def test_a_colliding_id_gets_a_fresh_one_and_the_same_bundle_twice_is_refused(tmp_path: Path, target: Store) -> None:
    manifest, members = _members(tmp_path)
    renamed = {**manifest, "run_id": "victim"}
    data = _edit("run.json", lambda r: {**r, "id": "victim"})(renamed, members)
    row = import_bundle(target, parse_bundle(data))
    assert row.id != "victim" and len(target.events(row.id)) == len(target.events("victim"))
    assert target.get_run("victim").summary == "the victim's own summary"
    before = _state(target)
    with pytest.raises(BundleError, match=f"already in this store as run {row.id}; nothing was imported"):
        import_bundle(target, parse_bundle(data))
    assert _state(target) == before


def test_terminal_escapes_in_texts_are_stripped_on_import(tmp_path: Path, target: Store) -> None:
    manifest, members = _members(tmp_path)
    evil = "\x1b[2J\x1b]0;owned\x07ok\x1b[8m"
    data = _edit("run.json", lambda r: {**r, "summary": evil, "cluster": f"cluster-a{evil}"})(manifest, members)
    data = _events(lambda es: [*es, {"seq": 50, "logChunk": {"source": "x", "lines": [evil]}}])(
        json.loads(json.dumps(manifest)), _unpacked(data)
    )
    row = import_bundle(target, parse_bundle(data))
    stored = target.get_run(row.id)
    text = json.dumps(asdict(stored)) + "".join(str(e) for e in target.events(row.id))
    assert "\x1b" not in text and "\\x1b" not in text and "\x07" not in text
    assert stored.summary == "ok"


def _unpacked(data: bytes) -> Members:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        out = {}
        for info in tar:
            handle = tar.extractfile(info)
            assert handle is not None
            out[info.name] = handle.read()
    out.pop(MANIFEST)
    return out


def test_a_failure_while_storing_leaves_nothing_half_imported(tmp_path: Path, target: Store) -> None:
    """The run row and its events are one transaction: an event that cannot be stored takes the row with it."""
    manifest, members = _members(tmp_path)
    bundle = parse_bundle(_sealed(manifest, members))
    before = _state(target)
    target.db.execute(
        "CREATE TRIGGER no_more BEFORE INSERT ON run_events WHEN NEW.seq = 5 BEGIN SELECT RAISE(ABORT, 'disk full'); END"
    )
    with pytest.raises(BundleError, match="cannot store the bundle's run: disk full; nothing was imported"):
        import_bundle(target, bundle)
    assert _state(target) == before


def test_import_reads_the_stream_not_the_size_it_claims(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(BundleError, match="over the limit of"):
        read_bundle(Path("/dev/zero"))
    assert time.monotonic() - started < 10
    with pytest.raises(BundleError, match="is a directory, not a bundle file"):
        read_bundle(tmp_path)


@pytest.mark.parametrize("what", ["dir", "dev-zero", "missing", "garbage", "running"])
def test_cli_import_of_a_hostile_file_is_one_line_and_exit_2(
    tmp_path: Path, what: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "k3.toml").write_text(
        'store = "k3.db"\n[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "i"\nlaunch = "vllm serve m"\n'
    )
    manifest, members = _members(tmp_path)
    files = {
        "dir": tmp_path,
        "dev-zero": Path("/dev/zero"),
        "missing": tmp_path / "nope.tar.gz",
        "garbage": tmp_path / "garbage.tar.gz",
        "running": tmp_path / "running.tar.gz",
    }
    (tmp_path / "garbage.tar.gz").write_bytes(b"\x1f\x8b garbage")
    (tmp_path / "running.tar.gz").write_bytes(
        _edit("run.json", lambda r: {**r, "status": "running"})(manifest, members)
    )
    assert main(["--config", str(tmp_path / "k3.toml"), "bundle", "import", str(files[what])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("k3repro: ") and err.count("\n") == 1 and "Traceback" not in err
    assert Store(tmp_path / "k3.db").runs() == []
