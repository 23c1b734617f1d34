"""The frozen bundle: everything a run recorded, as a tar.gz that another node can replay and check.

A manifest lists the sha256 of every member; import recomputes each one and refuses any difference
(a changed, added or missing member, a changed hash, a truncated file) with one line. The hashes prove
integrity in transit, not who made the bundle.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from hashlib import sha256
from importlib.metadata import version
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from bot.report import run_report
from bot.store import FINAL, Store
from protos import runner_pb2 as pb
from protos.vocab import to_id

FORMAT = 1
MANIFEST = "manifest.json"
MAX_BUNDLE_BYTES = 64 * 1024 * 1024  # compressed, as given to import
MAX_UNPACKED_BYTES = 256 * 1024 * 1024  # all members together: a small file must not unpack into a huge one
MEMBER_FIELDS = ("sha256", "bytes")


class BundleError(Exception):
    """A bundle that cannot be made or used; one line, and nothing was changed."""


@dataclass(frozen=True)
class Bundle:
    manifest: dict[str, Any]
    members: dict[str, bytes]

    @property
    def sha256(self) -> str:
        """The bundle's identity: the hash of its manifest, which pins every member."""
        return sha256(_canonical(self.manifest)).hexdigest()

    def json(self, name: str) -> Any:
        return json.loads(self.members[name])

    @property
    def run(self) -> dict[str, Any]:
        result: dict[str, Any] = self.json("run.json")
        return result

    @property
    def launch(self) -> dict[str, Any]:
        result: dict[str, Any] = self.json("launch.json")
        return result

    @property
    def fingerprint(self) -> dict[str, Any] | None:
        result: dict[str, Any] | None = self.json("fingerprint.json")
        return result

    def events(self) -> list[pb.RunEvent]:
        text = self.members["events.jsonl"].decode()
        return [json_format.Parse(line, pb.RunEvent()) for line in text.splitlines() if line]

    def to_bytes(self) -> bytes:
        """A reproducible tar.gz: members in manifest order, fixed times and owners."""
        raw = io.BytesIO()
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for name, data in ((MANIFEST, _canonical(self.manifest)), *self.members.items()):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        return raw.getvalue()


def export_bundle(store: Store, run_id: str) -> Bundle:
    """The bundle of a finished run from the store."""
    run = store.get_run(run_id)
    if run["status"] not in FINAL:
        raise BundleError(f"run {run['id']} is still {run['status']}: export it once it has ended")
    events = store.events(run["id"])
    report = run_report(run["id"], events)
    asked = json.loads(run["request_json"] or "{}")
    artifacts = {e.artifact.name: e.artifact.content for e in events if e.HasField("artifact")}
    fingerprint = json.loads(artifacts["fingerprint"]) if "fingerprint" in artifacts else None
    members: dict[str, bytes] = {
        "run.json": _json({k: run.get(k) for k in ("id", "cluster", "status", "decision", "summary", "image")}),
        "events.jsonl": "".join(json_format.MessageToJson(e, indent=None) + "\n" for e in events).encode(),
        "report.json": _json(report),
        "fingerprint.json": _json(fingerprint),
        "launch.json": _json(
            {
                "cluster": run["cluster"],
                "image": run["image"],
                "image_digest": image_digest(fingerprint),
                "argv": asked.get("argv", []),
                "minimal_command": artifacts.get("minimal_command", ""),
                "profile": asked.get("profile", ""),
            }
        ),
        "request.json": _json(
            {"api": asked.get("api", "chat"), "body_json": asked.get("request", ""), "repeats": asked.get("repeats", 3)}
        ),
        "first_error.json": _json(report["first_error"]),
        "checklist.json": _json(_checklist(events)),
        "steps.json": _json(_steps(events)),
    }
    for source, text in logs_by_source(events).items():
        members[f"logs/{source.replace('/', '-')}.log"] = text.encode()
    if "sim_scenario" in artifacts:
        members["scenario.toml"] = artifacts["sim_scenario"].encode()
    manifest = {
        "format": FORMAT,
        "produced_by": f"k3repro {version('k3repro')}",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "run_id": run["id"],
        "members": {name: {"sha256": sha256(data).hexdigest(), "bytes": len(data)} for name, data in members.items()},
    }
    return Bundle(manifest, members)


def read_bundle(path: Path) -> Bundle:
    """Reads and verifies a bundle file; any doubt about it is a BundleError."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror}") from None
    if size > MAX_BUNDLE_BYTES:
        raise BundleError(f"bundle {path} is {size} bytes, over the limit of {MAX_BUNDLE_BYTES} bytes")
    return parse_bundle(path.read_bytes(), str(path))


def parse_bundle(data: bytes, origin: str = "bundle") -> Bundle:
    members: dict[str, bytes] = {}
    unpacked = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for info in tar:
                if not info.isfile():
                    raise BundleError(f"{origin}: member {info.name!r} is not a regular file")
                if info.name in members:
                    raise BundleError(f"{origin}: member {info.name!r} appears twice")
                unpacked += info.size
                if unpacked > MAX_UNPACKED_BYTES:
                    raise BundleError(f"{origin}: unpacks to over {MAX_UNPACKED_BYTES // 2**20} MiB")
                extracted = tar.extractfile(info)
                members[info.name] = extracted.read() if extracted else b""
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BundleError(f"{origin} is truncated or not a k3repro bundle ({exc})") from None
    return _verified(members, origin)


def _verified(members: dict[str, bytes], origin: str) -> Bundle:
    if MANIFEST not in members:
        raise BundleError(f"{origin}: no {MANIFEST}; not a k3repro bundle")
    try:
        manifest = json.loads(members.pop(MANIFEST))
        listed: dict[str, dict[str, Any]] = manifest["members"]
        if manifest["format"] != FORMAT:
            raise BundleError(f"{origin}: bundle format {manifest['format']!r} (this k3repro reads {FORMAT})")
        if not all(isinstance(v, dict) and set(v) == set(MEMBER_FIELDS) for v in listed.values()):
            raise TypeError("members")
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{origin}: the manifest is malformed ({exc})") from None
    for name in members.keys() - listed.keys():
        raise BundleError(f"{origin}: member {name!r} is not in the manifest (added after export)")
    for name in listed.keys() - members.keys():
        raise BundleError(f"{origin}: member {name!r} listed in the manifest is missing")
    for name, entry in listed.items():
        if sha256(members[name]).hexdigest() != entry["sha256"] or len(members[name]) != entry["bytes"]:
            raise BundleError(f"{origin}: member {name!r} does not match its sha256 in the manifest (tampered)")
    return Bundle(manifest, {name: members[name] for name in listed})


def import_bundle(store: Store, bundle: Bundle) -> dict[str, Any]:
    """Adds a verified bundle's run and events to the store, so it can be shown and rerun here."""
    run = bundle.run
    try:
        store.get_run(run["id"])
    except LookupError:
        pass
    else:
        raise BundleError(f"run {run['id']} is already in this store; nothing was imported")
    stamp = datetime.now(UTC).isoformat(timespec="milliseconds")
    launch, request = bundle.launch, bundle.json("request.json")
    row = {
        **run,
        "runner": f"bundle:{bundle.sha256[:12]}",
        "requested_by": f"import of {bundle.manifest['produced_by']}",
        "request_json": json.dumps(
            {
                "argv": launch["argv"],
                "request": request["body_json"],
                "api": request["api"],
                "repeats": request["repeats"],
                "profile": launch["profile"],
            }
        ),
        "created_at": stamp,
        "updated_at": stamp,
        "finished_at": stamp,
    }
    store.import_run(row, bundle.events())
    return row


def image_digest(fingerprint: dict[str, Any] | None) -> str:
    """ "sha256:…" of the image the scene ran, when the registry pinned one; "" when it is known by tag only."""
    image = (fingerprint or {}).get("image") or {}
    refs = [image.get("ref") or "", *(image.get("repo_digests") or [])]
    return next((ref.split("@", 1)[1] for ref in refs if "@sha256:" in ref), "")


def _checklist(events: list[pb.RunEvent]) -> dict[str, dict[str, str]]:
    latest: dict[str, dict[str, str]] = {}
    for e in events:
        if e.HasField("checklist_item"):
            item = e.checklist_item
            state = to_id(pb.ChecklistState, item.state)
            latest[to_id(pb.ChecklistId, item.item)] = {"state": state, "evidence": item.evidence}
    return latest


def _steps(events: list[pb.RunEvent]) -> list[dict[str, Any]]:
    """Every stage's and ladder step's result, in order: the before/after of each change."""
    steps: list[dict[str, Any]] = []
    for e in events:
        if e.HasField("stage_finished"):
            m = e.stage_finished
            status = to_id(pb.StageStatus, m.status)
            steps.append({"stage": to_id(pb.Stage, m.stage), "status": status, "summary": m.summary})
        elif e.HasField("ladder_step"):
            step = json_format.MessageToDict(e.ladder_step, preserving_proto_field_name=True)
            steps.append({"ladder_step": step})
    return steps


def logs_by_source(events: list[pb.RunEvent]) -> dict[str, str]:
    """A run's whole log, one text per source (e.g. "minimal_launch/stdout")."""
    texts: dict[str, list[str]] = {}
    for e in events:
        if e.HasField("log_chunk"):
            texts.setdefault(e.log_chunk.source, []).extend(e.log_chunk.lines)
    return {source: "\n".join(lines) + "\n" for source, lines in texts.items()}


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
