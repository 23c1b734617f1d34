"""The frozen bundle: everything a run recorded, as a tar.gz that another node can replay and check.

A manifest lists the sha256 of every member; import recomputes each one and refuses any difference
(a changed, added or missing member, a changed hash, a truncated file) with one line. The hashes prove
integrity in transit, not who made the bundle: an imported bundle is hostile input. Import reads at most
the limits below from the stream (never trusting a size the file or a header claims), checks every member
against a schema, takes the run's id from the manifest (never from an event), gives it a fresh id when the
store has that id already, stores only finished runs, strips terminal control sequences, and writes the
run and its events in one transaction: a refused bundle leaves nothing behind. What a bundle's launch.json
says is never launched: a rerun or a minimize run of an imported run launches its cluster's command as this
bot's config holds it, and only when the bundle's (redacted) command is that one (bot/rerun.py,
configured_launch).

Export passes every member through the one redaction path (kernel/redact.py), and keeps only the request
body's sha256 when the run's scene did (`request_bodies = "hash"` on the runner). The run's timeline picture
(TIMELINE) is drawn from the redacted events, so no text in it escaped that path; import checks only that it
is a PNG, by its signature, and never decodes, stores or believes it: the events are the record.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import sqlite3
import tarfile
import zlib
from dataclasses import asdict, dataclass, replace
from hashlib import sha256
from importlib.metadata import version
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from bot import timeline
from bot.handoff import handoff, linked
from bot.ids import new_run_id
from bot.record import LadderStep, RunRecord, StageResult, image_digest
from bot.report import report
from bot.store import FINAL, Run, RunState, Store
from kernel.clock import WALL
from kernel.redact import map_strings, printable, redactor
from protos import runner_pb2 as pb
from protos.vocab import API_PATHS, DEFAULT_API, DEFAULT_REPEATS, Decision, RunStatus

FORMAT = 1
MANIFEST = "manifest.json"
MAX_BUNDLE_BYTES = 64 * 1024 * 1024  # compressed, as given to import
MAX_UNPACKED_BYTES = 256 * 1024 * 1024  # all members together: a small file must not unpack into a huge one
MEMBER_FIELDS = ("sha256", "bytes")
MAX_MEMBERS = 512  # a bundle has a dozen members and one log per launch
MAX_DEPTH = 2  # "logs/<source>.log"
MAX_EVENTS = 200_000
RUN_FIELDS = ("id", "cluster", "status", "decision", "summary", "image")  # of the store's run, in run.json
REQUIRED = ("run.json", "events.jsonl", "launch.json", "request.json", "fingerprint.json")
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MEMBER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SHA256 = re.compile(r"[0-9a-f]{64}")
TIMELINE = "timeline.png"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
APIS = tuple(API_PATHS)
MAX_JSON_DEPTH = 64  # nesting of any JSON the bot reads from outside (a bundle's members, a Slack payload)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
IMPORTED = "bundle:"  # an imported run's `runner`: `bundle:` and its sha256's first 12 hex digits


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
        return bounded_json(self.members[name])

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
        return [json_format.Parse(_shallow(line), pb.RunEvent()) for line in text.splitlines() if line]

    def request_body(self) -> str | None:
        """The fixed request's body, or None when the bundle keeps only its sha256."""
        body = self.json("request.json").get("body_json")
        return body if isinstance(body, str) else None

    def to_bytes(self) -> bytes:
        """A reproducible tar.gz: members in manifest order, fixed times and owners."""
        raw = io.BytesIO()
        with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
            for name, data in ((MANIFEST, _canonical(self.manifest)), *self.members.items()):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        return raw.getvalue()


def too_deep(data: bytes | str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests its arrays and objects deeper than `limit`, found without parsing it, so a
    hostile document costs a few passes in C and no recursion. Its brackets are counted with the ones inside
    strings first (an upper bound, enough for most documents); only when that is over the limit are the
    strings taken out and they are counted again."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if _bracket_depth(_NOT_BRACKET.sub(b"", raw), limit) <= limit:
        return False
    return _bracket_depth(_NOT_BRACKET.sub(b"", _JSON_STRING.sub(b"", raw)), limit) > limit


def _bracket_depth(brackets: bytes, limit: int) -> int:
    """The nesting of a string of brackets (their kinds alike), up to limit + 1: each round takes out the
    innermost pairs; a bracket that never pairs counts one level."""
    brackets = brackets.translate(_ONE_KIND)
    if b"[" * (limit + 1) in brackets:  # the usual hostile document: a run of opening brackets
        return limit + 1
    rounds = 0
    while brackets and rounds <= limit:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break
        brackets, rounds = shorter, rounds + 1
    return rounds + len(brackets)


def _shallow(text: str) -> str:
    if too_deep(text):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return text


def bounded_json(data: bytes | str) -> Any:
    """json.loads, refusing (ValueError) a document nested deeper than MAX_JSON_DEPTH before parsing it."""
    if too_deep(data):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return json.loads(data)


def export_bundle(store: Store, run_id: str, ended: tuple[RunStatus, Decision | None] | None = None) -> Bundle:
    """The bundle of a finished run from the store, every member redacted. `ended`: the (status, decision) of a
    run whose last event is stored but whose row is not final yet (the thread's verdict is posted before)."""
    run = store.get_run(run_id)
    if ended is not None and run.status not in FINAL:
        run = replace(run, status=RunState(ended[0]), decision=ended[1])
    if run.status not in FINAL:
        raise BundleError(f"run {run.id} is still {run.status}: export it once it has ended")
    events = [redactor().message(e) for e in store.events(run.id)]
    record = RunRecord.replay(run.id, events)
    found = report(record)
    asked = public_request(run, record)
    artifacts, fingerprint = record.artifacts, record.scene
    members: dict[str, bytes] = {
        "run.json": _json({k: v for k, v in asdict(run).items() if k in RUN_FIELDS}),
        "events.jsonl": "".join(json_format.MessageToJson(e, indent=None) + "\n" for e in events).encode(),
        "report.json": _json(found),
        "fingerprint.json": _json(fingerprint),
        "launch.json": _json(
            {
                "cluster": run.cluster,
                "image": run.image,
                "image_digest": image_digest(fingerprint),
                "argv": asked.get("argv", []),
                "minimal_command": artifacts.get("minimal_command", ""),
                "profile": asked.get("profile", ""),
            }
        ),
        "request.json": _json({k: v for k, v in asked.items() if k in ("api", "body_json", "body_sha256", "repeats")}),
        "first_error.json": _json(found["first_error"]),
        "checklist.json": _json(
            {c.item: {"state": c.state, "evidence": c.evidence} for c in record.checklist.values()}
        ),
        "steps.json": _json([_step(step) for step in record.steps]),
    }
    for source, text in record.log_texts().items():
        members[f"logs/{source.replace('/', '-')}.log"] = text.encode()
    members["report.md"] = handoff(run, record, linked(store, run)).encode()  # the hand-off report (bot/handoff.py)
    if "sim_scenario" in artifacts:
        members["scenario.toml"] = artifacts["sim_scenario"].encode()
    for name, content in artifacts.items():  # a stalled launch's raw py-spy dumps (runner/stacks/collect.py)
        if name.startswith("stacks/launch-") and name.removeprefix("stacks/launch-").isdigit():
            members[f"{name}.txt"] = content.encode()
    members = {name: _redacted(name, data) for name, data in members.items()}
    members[TIMELINE] = timeline.png(record.launches, timeline.caption(run.id, run.cluster, run.decision or run.status))
    manifest = {
        "format": FORMAT,
        "produced_by": f"k3repro {version('k3repro')}",
        "created_at": WALL.stamp("seconds"),
        "run_id": run.id,
        "members": {name: {"sha256": sha256(data).hexdigest(), "bytes": len(data)} for name, data in members.items()},
    }
    return Bundle(manifest, members)


def public_request(run: Run, record: RunRecord) -> dict[str, Any]:
    """What a run was asked to do, as it may leave the bot (bundle, `show --json`): redacted, and with
    only the body's sha256 when the run's scene kept only that (the runner's `request_bodies = "hash"`)."""
    try:
        asked = json.loads(redactor().json_text(run.request_json or "{}"))
    except ValueError:
        asked = {}
    asked = asked if isinstance(asked, dict) else {}
    result: dict[str, Any] = {
        "argv": asked.get("argv", []),
        "api": asked.get("api", DEFAULT_API),
        "repeats": asked.get("repeats", DEFAULT_REPEATS),
        "profile": asked.get("profile", ""),
    }
    kept = (record.scene or {}).get("request")
    if isinstance(kept, dict) and kept.get("body") is None and kept.get("body_sha256"):
        result["body_sha256"] = kept["body_sha256"]
    else:
        result["body_json"] = asked.get("request", "")
    return result


def _redacted(name: str, data: bytes) -> bytes:
    """A member through the redaction path: JSON by structure (each line of events.jsonl), text by line."""
    r = redactor()
    text = data.decode("utf-8", "replace")
    if name.endswith(".json"):
        return r.json_text(text).encode()
    redact = r.json_text if name.endswith(".jsonl") else r.line
    return "".join(redact(line.rstrip("\n")) + "\n" for line in text.splitlines(keepends=True)).encode()


def read_bundle(path: Path) -> Bundle:
    """Reads and verifies a bundle file; any doubt about it is a BundleError. At most MAX_BUNDLE_BYTES are
    read, whatever the file claims to be (a pipe or /dev/zero has no honest size)."""
    if path.is_dir():
        raise BundleError(f"{path} is a directory, not a bundle file")
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"cannot read bundle {path}: {exc.strerror}") from None
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"bundle {path} is over the limit of {MAX_BUNDLE_BYTES} bytes")
    return parse_bundle(data, str(path))


def parse_bundle(data: bytes, origin: str = "bundle") -> Bundle:
    """The gzip stream is inflated to at most MAX_UNPACKED_BYTES before tar reads it, so no header (a
    huge size, a long name) can make it read more."""
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as gz:
            raw = gz.read(MAX_UNPACKED_BYTES + 1)
    except (EOFError, zlib.error, OSError) as exc:
        raise BundleError(f"{origin} is truncated or not a k3repro bundle ({exc})") from None
    if len(raw) > MAX_UNPACKED_BYTES:
        raise BundleError(f"{origin}: unpacks to over {MAX_UNPACKED_BYTES // 2**20} MiB")
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for info in tar:
                if len(members) >= MAX_MEMBERS:
                    raise BundleError(f"{origin}: over {MAX_MEMBERS} members")
                _check_member(info, members, origin)
                extracted = tar.extractfile(info)
                members[info.name] = extracted.read(info.size) if extracted else b""
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"{origin} is truncated or not a k3repro bundle ({exc})") from None
    return _verified(members, origin)


def _check_member(info: tarfile.TarInfo, members: dict[str, bytes], origin: str) -> None:
    name = printable(info.name)
    parts = info.name.split("/")
    if not info.isfile():
        raise BundleError(f"{origin}: member {name!r} is not a regular file")
    if len(parts) > MAX_DEPTH or not all(MEMBER_NAME.fullmatch(p) for p in parts):
        raise BundleError(f"{origin}: member name {name!r} is not one a bundle has")
    if info.name in members:
        raise BundleError(f"{origin}: member {name!r} appears twice")


def _verified(members: dict[str, bytes], origin: str) -> Bundle:
    if MANIFEST not in members:
        raise BundleError(f"{origin}: no {MANIFEST}; not a k3repro bundle")
    try:
        manifest = bounded_json(members.pop(MANIFEST))
        listed: dict[str, dict[str, Any]] = manifest["members"]
        if manifest["format"] != FORMAT:
            raise BundleError(
                f"{origin}: bundle format {printable(str(manifest['format']))!r} (this k3repro reads {FORMAT})"
            )
        if not isinstance(listed, dict) or not all(
            isinstance(v, dict)
            and set(v) == set(MEMBER_FIELDS)
            and isinstance(v["sha256"], str)
            and isinstance(v["bytes"], int)
            for v in listed.values()
        ):
            raise TypeError("members")
        if not isinstance(manifest.get("run_id"), str) or not RUN_ID.fullmatch(manifest["run_id"]):
            raise TypeError("run_id")
        if not isinstance(manifest.get("produced_by"), str):
            raise TypeError("produced_by")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise BundleError(f"{origin}: the manifest is malformed ({printable(str(exc))[:80]})") from None
    for name in members.keys() - listed.keys():
        raise BundleError(f"{origin}: member {name!r} is not in the manifest (added after export)")
    for name in listed.keys() - members.keys():
        raise BundleError(f"{origin}: member {printable(name)[:80]!r} listed in the manifest is missing")
    for name, entry in listed.items():
        if sha256(members[name]).hexdigest() != entry["sha256"] or len(members[name]) != entry["bytes"]:
            raise BundleError(f"{origin}: member {name!r} does not match its sha256 in the manifest (tampered)")
    for name in REQUIRED:
        if name not in listed:
            raise BundleError(f"{origin}: no {name}; not a k3repro bundle")
    bundle = Bundle(manifest, {name: members[name] for name in listed})
    _check_schema(bundle, origin)
    return bundle


def _check_schema(bundle: Bundle, origin: str) -> None:
    """Every member import or a rerun reads, by type; the first thing wrong is the one line."""

    def need(ok: bool, problem: str) -> None:
        if not ok:
            raise BundleError(f"{origin}: {problem}")

    try:
        run, launch, asked = bundle.run, bundle.launch, bundle.json("request.json")
        fingerprint = bundle.json("fingerprint.json")
        events = bundle.events()
    except (ValueError, RecursionError, json_format.ParseError) as exc:
        detail = printable(str(exc)).split("\n", 1)[0][:120] or type(exc).__name__
        raise BundleError(f"{origin}: a member is not valid JSON ({detail})") from None
    need(isinstance(run, dict), "run.json is not an object")
    need(run.get("id") == bundle.manifest["run_id"], "run.json's id is not the manifest's run_id")
    need(isinstance(run.get("cluster"), str) and bool(run["cluster"]), "run.json: cluster must be a name")
    need(run.get("status") in FINAL, f"run.json: status must be one of {', '.join(FINAL)} (a finished run)")
    need(run.get("decision") in (None, "", *Decision), f"run.json: decision is not {', '.join(Decision)}")
    need(all(isinstance(run.get(k), str | None) for k in ("summary", "image")), "run.json: summary/image not text")
    need(isinstance(launch, dict), "launch.json is not an object")
    for key in ("cluster", "image", "image_digest", "minimal_command", "profile"):
        need(isinstance(launch.get(key), str), f"launch.json: {key} must be a string")
    argv = launch.get("argv")
    need(isinstance(argv, list) and all(isinstance(a, str) for a in argv), "launch.json: argv must be strings")
    need(isinstance(asked, dict) and asked.get("api") in APIS, f"request.json: api must be one of {', '.join(APIS)}")
    repeats = asked.get("repeats")
    need(type(repeats) is int and 1 <= repeats <= 100, "request.json: repeats must be a whole number 1-100")
    digest = asked.get("body_sha256")
    need(
        isinstance(asked.get("body_json"), str) or (isinstance(digest, str) and bool(SHA256.fullmatch(digest))),
        "request.json: body_json (text) or body_sha256 (hex) expected",
    )
    need(fingerprint is None or isinstance(fingerprint, dict), "fingerprint.json is not an object")
    need(len(events) <= MAX_EVENTS, f"events.jsonl: over {MAX_EVENTS} events")
    seqs = [e.seq for e in events]
    need(all(seq > 0 for seq in seqs) and seqs == sorted(set(seqs)), "events.jsonl: seqs must rise, each once")
    need(all(e.WhichOneof("payload") not in (None, "heartbeat") for e in events), "events.jsonl: an empty event")
    picture = bundle.members.get(TIMELINE, PNG_SIGNATURE)  # a bundle from before the picture has none
    need(picture.startswith(PNG_SIGNATURE), f"{TIMELINE} is not a PNG")


def import_bundle(store: Store, bundle: Bundle) -> Run:
    """Adds a verified bundle's run and its events to the store, in one transaction. The run keeps the
    bundle's id unless the store has it already (then it gets a fresh one); its events all get that id,
    whatever they say; every text is stripped of terminal control sequences (and redacted by the store)."""
    source = f"{IMPORTED}{bundle.sha256[:12]}"
    if known := store.run_ids_of_runner(source):
        raise BundleError(f"this bundle is already in this store as run {known[0]}; nothing was imported")
    run = bundle.run
    run_id = run["id"]
    try:
        store.get_run(run_id)
    except LookupError:
        pass
    else:
        run_id = new_run_id()
    stamp = WALL.stamp()
    launch, body = bundle.launch, bundle.request_body()
    asked = bundle.json("request.json")
    request: dict[str, Any] = {
        "argv": [printable(a) for a in launch["argv"]],
        "request": printable(body or ""),
        "api": asked["api"],
        "repeats": asked["repeats"],
        "profile": printable(launch["profile"]),
    }
    if body is None:
        request["body_sha256"] = asked["body_sha256"]
    imported = Run(
        id=run_id,
        cluster=printable(run["cluster"]),
        runner=source,
        status=run["status"],
        requested_by=printable(f"import of {bundle.manifest['produced_by']}")[:120],
        channel=None,
        thread_ts=None,
        image=printable(run.get("image") or ""),
        request_json=json.dumps(request),
        decision=run.get("decision") or None,
        summary=printable(run.get("summary") or ""),
        created_at=stamp,
        updated_at=stamp,
        finished_at=stamp,
        rerun_of=None,
    )
    events = [map_strings(e, printable) for e in bundle.events()]
    for event in events:
        event.run_id = run_id
    try:
        store.import_run(imported, events)
    except sqlite3.Error as exc:
        raise BundleError(f"cannot store the bundle's run: {exc}; nothing was imported") from None
    return imported


def is_imported(run: Run) -> bool:
    """Whether a run came from a bundle: what it recorded (its launch command included) is the bundle's."""
    return run.runner.startswith(IMPORTED)


def _step(step: StageResult | LadderStep) -> dict[str, Any]:
    """A stage's or ladder step's result as the bundle keeps it: the before/after of each change."""
    if isinstance(step, StageResult):
        return {"stage": step.stage, "status": step.status, "summary": step.summary}
    return {"ladder_step": json_format.MessageToDict(step.wire, preserving_proto_field_name=True)}


def _json(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
