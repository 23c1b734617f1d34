"""The frozen bundle: export → import round trip, and every kind of damage refused with one line."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from hashlib import sha256
from pathlib import Path

import pytest
from matplotlib.image import imread

from bot import bundle as bundle_module
from bot.bundle import (
    MANIFEST,
    PNG_SIGNATURE,
    TIMELINE,
    Bundle,
    BundleError,
    export_bundle,
    import_bundle,
    parse_bundle,
    read_bundle,
)
from bot.cli import main
from bot.store import Store
from protos import runner_pb2 as pb

SCENE = {
    "schema": 1,
    "nvml": {"driver_version": "580.65.06", "processes": []},
    "image": {"ref": "vllm/vllm-openai:kimi-k3", "repo_digests": ["vllm/vllm-openai@sha256:" + "ab" * 32]},
    "changes": [{"at": "2026-11-30T09:00:00Z", "what": "driver upgrade", "by": "ops"}],
}
ARGV = ["vllm", "serve", "moonshotai/Kimi-K3", "--tensor-parallel-size", "8", "--enable-prefix-caching"]


def _events(run_id: str) -> list[pb.RunEvent]:
    payloads: list[dict[str, object]] = [
        {"stage_started": pb.StageStarted(stage=pb.STAGE_FREEZE)},
        {"artifact": pb.Artifact(name="fingerprint", media_type="application/json", content=json.dumps(SCENE))},
        {"artifact": pb.Artifact(name="sim_scenario", media_type="text/plain", content='description = "x"\n')},
        {"artifact": pb.Artifact(name="minimal_command", media_type="text/plain", content="vllm serve m")},
        {"log_chunk": pb.LogChunk(source="minimal_launch/stdout", lines=["INFO starting", "ERROR boom"])},
        {
            "first_error": pb.FirstError(
                phase=pb.PHASE_GPU_DETECT, category=pb.ERROR_CATEGORY_NCCL_COMM, line="ERROR boom", signature="s1"
            )
        },
        {
            "checklist_item": pb.ChecklistItem(
                item=pb.CHECKLIST_ID_FAILURE_REPEATED, state=pb.CHECKLIST_STATE_HOLDS, evidence="2 of 2"
            )
        },
        {
            "stage_finished": pb.StageFinished(
                stage=pb.STAGE_MINIMAL_LAUNCH, status=pb.STAGE_STATUS_FAILED, summary="failed in gpu_detect"
            )
        },
        {"run_finished": pb.RunFinished(status=pb.RUN_STATUS_COMPLETED, decision=pb.DECISION_CONTINUE, launches=2)},
    ]
    return [pb.RunEvent(run_id=run_id, seq=seq, **p) for seq, p in enumerate(payloads, start=1)]  # type: ignore[arg-type]


def _store(path: Path, run_id: str = "20261130-090000-abcd", status: str = "completed") -> Store:
    store = Store(path)
    request = {"argv": ARGV, "request": '{"max_tokens": 8}', "api": "chat", "repeats": 3, "profile": "kimi-k3"}
    store.create_run(
        run_id, "cluster-a", runner="127.0.0.1:1", image="vllm/vllm-openai:kimi-k3", request_json=json.dumps(request)
    )
    if status != "running":
        store.finish_run(run_id, status)
    for event in _events(run_id):
        store.add_event(event)
    return store


def _repack(data: bytes, change: dict[str, bytes | None]) -> bytes:
    """The bundle's tar with members replaced (bytes), removed (None) or added, as an attacker would."""
    members: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for info in tar:
            extracted = tar.extractfile(info)
            assert extracted is not None
            members[info.name] = extracted.read()
    for name, content in change.items():
        if content is None:
            del members[name]
        else:
            members[name] = content
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb") as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    return raw.getvalue()


def test_round_trip_keeps_every_member_and_event(tmp_path: Path) -> None:
    store = _store(tmp_path / "a.db")
    made = export_bundle(store, "20261130-090000")
    data = made.to_bytes()
    back = parse_bundle(data)
    assert back.members == made.members and back.sha256 == made.sha256
    names = set(back.members)
    assert {
        "fingerprint.json",
        "launch.json",
        "request.json",
        "first_error.json",
        "checklist.json",
        "steps.json",
    } <= names
    assert {"events.jsonl", "report.json", "run.json", "scenario.toml", "logs/minimal_launch-stdout.log"} <= names
    picture = back.members[TIMELINE]  # drawn from the (redacted) events, listed with its sha256 like the rest
    assert picture.startswith(PNG_SIGNATURE) and imread(io.BytesIO(picture), format="png").shape[1] > 1000
    assert back.manifest["members"][TIMELINE] == {"sha256": sha256(picture).hexdigest(), "bytes": len(picture)}
    assert back.launch["argv"] == ARGV and back.launch["minimal_command"] == "vllm serve m"
    assert back.launch["image_digest"] == "sha256:" + "ab" * 32
    assert back.json("first_error.json")["signature"] == "s1"
    assert back.json("checklist.json")["failure_repeated"] == {"state": "holds", "evidence": "2 of 2"}
    assert back.json("request.json") == {"api": "chat", "body_json": '{"max_tokens": 8}', "repeats": 3}
    assert back.manifest["format"] == 1 and back.manifest["produced_by"].startswith("k3repro ")
    other = Store(tmp_path / "b.db")
    row = import_bundle(other, back)
    assert row.id == "20261130-090000-abcd" and other.get_run(row.id).status == "completed"
    assert other.events(row.id) == store.events(row.id)
    with pytest.raises(BundleError, match="already in this store as run 20261130-090000-abcd; nothing was imported"):
        import_bundle(other, back)
    assert len(other.events(row.id)) == len(_events("x"))


def test_an_active_run_is_not_exported(tmp_path: Path) -> None:
    store = _store(tmp_path / "a.db", status="running")
    with pytest.raises(BundleError, match="is still running: export it once it has ended"):
        export_bundle(store, "20261130-090000-abcd")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"launch.json": b'{"argv": ["vllm", "serve", "evil"]}'}, "member 'launch.json' does not match its sha256"),
        ({"extra.sh": b"rm -rf /"}, "member 'extra.sh' is not in the manifest (added after export)"),
        ({"fingerprint.json": None}, "member 'fingerprint.json' listed in the manifest is missing"),
        ({MANIFEST: None}, "no manifest.json; not a k3repro bundle"),
        ({MANIFEST: b"{not json"}, "the manifest is malformed"),
    ],
)
def test_a_tampered_bundle_is_refused_with_one_line(
    tmp_path: Path, change: dict[str, bytes | None], expected: str
) -> None:
    data = export_bundle(_store(tmp_path / "a.db"), "20261130-090000-abcd").to_bytes()
    with pytest.raises(BundleError) as caught:
        parse_bundle(_repack(data, change), "b.tar.gz")
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def _resealed(made: Bundle, change: dict[str, bytes | None]) -> bytes:
    """The bundle with members changed and the manifest's hashes recomputed: only the schema can refuse it."""
    members = {name: data for name, data in {**made.members, **change}.items() if data is not None}
    listed = {name: {"sha256": sha256(data).hexdigest(), "bytes": len(data)} for name, data in members.items()}
    return Bundle({**made.manifest, "members": listed}, members).to_bytes()


def test_the_timeline_is_only_a_picture_to_import(tmp_path: Path) -> None:
    """Import checks its signature and nothing else reads it: a bundle without one (made before it existed)
    imports the same run; a member by that name that is not a PNG is refused."""
    made = export_bundle(_store(tmp_path / "a.db"), "20261130-090000-abcd")
    other = Store(tmp_path / "b.db")
    row = import_bundle(other, parse_bundle(_resealed(made, {TIMELINE: None})))
    assert len(other.events(row.id)) == len(_events("x"))
    with pytest.raises(BundleError, match=r"timeline\.png is not a PNG"):
        parse_bundle(_resealed(made, {TIMELINE: b"<script>alert(1)</script>"}))


def test_a_changed_hash_in_the_manifest_is_refused(tmp_path: Path) -> None:
    made = export_bundle(_store(tmp_path / "a.db"), "20261130-090000-abcd")
    manifest = json.loads(json.dumps(made.manifest))
    manifest["members"]["request.json"]["sha256"] = "0" * 64
    data = _repack(made.to_bytes(), {MANIFEST: json.dumps(manifest).encode()})
    with pytest.raises(BundleError, match=r"member 'request\.json' does not match its sha256 in the manifest"):
        parse_bundle(data)


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_a_truncated_bundle_is_refused(tmp_path: Path, keep: float) -> None:
    data = export_bundle(_store(tmp_path / "a.db"), "20261130-090000-abcd").to_bytes()
    with pytest.raises(BundleError, match=r"is truncated or not a k3repro bundle") as caught:
        parse_bundle(data[: int(len(data) * keep)], "cut.tar.gz")
    assert "\n" not in str(caught.value)


def test_cli_export_and_import_and_their_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _store(tmp_path / "a.db").close()
    for name in ("a", "b"):
        (tmp_path / f"{name}.toml").write_text(
            f'store = "{name}.db"\n[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "i"\nlaunch = "vllm serve m"\n'
        )
    file = tmp_path / "case.tar.gz"
    assert main(["--config", str(tmp_path / "a.toml"), "bundle", "export", "20261130-09", "-o", str(file)]) == 0
    assert "sha256" in capsys.readouterr().out
    assert main(["--config", str(tmp_path / "a.toml"), "bundle", "export", "20261130-09", "-o", str(file)]) == 2
    assert capsys.readouterr().err.strip().endswith("exists; not overwritten")
    assert main(["--config", str(tmp_path / "a.toml"), "bundle", "export", "nope", "-o", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == "k3repro: no run 'nope'"
    assert main(["--config", str(tmp_path / "b.toml"), "bundle", "import", str(file)]) == 0
    assert "every member verified" in capsys.readouterr().out
    assert Store(tmp_path / "b.db").get_run("20261130-090000-abcd").cluster == "cluster-a"

    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(file.read_bytes()[:200])
    monkeypatch.setattr(bundle_module, "MAX_BUNDLE_BYTES", 100)
    assert main(["--config", str(tmp_path / "b.toml"), "bundle", "import", str(cut)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is over the limit of 100 bytes" in err
    with pytest.raises(BundleError, match="cannot read bundle"):
        read_bundle(tmp_path / "missing.tar.gz")
