"""The isolated rerun: the frozen bundle replayed on a runner an isolation provider gives, and the verdict.

What it launches is the cluster's configured command (configured_launch, which minimize shares), never the
bundle's: a run's recorded command is redacted, and an imported run's is whatever its bundle said.

`reproduced`: same phase and same first-error signature (the cause travels with the software and the
configuration). `not_reproduced`: the isolated run passes where the original failed (suspect the
environment: the fingerprint differences that matter are listed). `different_failure`: a new candidate.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bot.bundle import MAX_BUNDLE_BYTES, Bundle, BundleError, export_bundle, is_imported
from bot.config import BotConfig
from bot.consumer import EventCallback, LiveStream, RunRefused, accept, follow_run
from bot.coordinator import Coordinator
from bot.ids import new_run_id
from bot.isolation import IsolationError, Placement, Provider, make_provider
from bot.record import RunRecord
from bot.refusal import Refused
from bot.store import RerunVerdict, Run, RunState, Store
from kernel.fingerprint import diff
from kernel.images import pinned_to
from kernel.redact import PLACEHOLDER, redactor
from kernel.toml_reader import ConfigError
from protos import runner_pb2 as pb
from protos.vocab import RunStatus, member

Started = Callable[[str, Placement], Awaitable[None]]
_UNSHOWN = re.compile(r"[^\w@%+=:,./\[\]-]")  # what a refusal does not show of a recorded (maybe hostile) word
MAX_SHOWN = 6  # words of a difference named in a refusal


def configured_launch(config: BotConfig, run: Run) -> list[str]:
    """The argv a minimize run or an isolated rerun of `run` launches: its cluster's launch command as this bot's
    config holds it, unredacted. Never the command the store or a bundle recorded: that is redacted (a replayed
    `--api-key [REDACTED:…]` is another configuration) and, for an imported run, whatever the bundle said.
    Refused (one line, nothing started) when the cluster is not in this config, or when the run's recorded
    command is not the configured one. Both are compared redacted, through the one redaction path
    (kernel/redact.py), a secret's placeholder equal to any other: the redaction key may be another process's."""
    origin = f"run {run.id}" + (" (imported from a bundle)" if is_imported(run) else "")
    cluster = config.clusters.get(run.cluster)
    if cluster is None:
        known = ", ".join(sorted(config.clusters)) or "none configured"
        raise Refused(
            f"{origin} is for cluster '{_shown(run.cluster)}', which this bot's config does not have (known: {known}): "
            "only a configured cluster's own command is launched; nothing was started"
        )
    try:
        asked = json.loads(run.request_json or "{}")
    except ValueError:
        asked = None
    recorded = asked.get("argv") if isinstance(asked, dict) else None
    if not isinstance(recorded, list) or not all(isinstance(token, str) for token in recorded):
        raise Refused(
            f"{origin} recorded no launch command to compare with cluster {cluster.name}'s; nothing was started"
        )
    configured = list(cluster.launch_argv)
    theirs, ours = _comparable(recorded), _comparable(configured)
    if theirs != ours:
        raise Refused(
            f"{origin} launched another command than cluster {cluster.name}'s configured one "
            f"({_difference(theirs, ours)}): minimize and rerun launch only the configured command; nothing was started"
        )
    return configured


def command_line(argv: Sequence[str]) -> str:
    """A launch command as the terminal and Slack show it: redacted by the one path, shell-quoted, as the runner
    shows its launches."""
    return shlex.join(redactor().argv(list(argv)))


def _comparable(argv: Sequence[str]) -> list[str]:
    return [PLACEHOLDER.sub("[REDACTED]", token) for token in redactor().argv(list(argv))]


def _difference(recorded: list[str], configured: list[str]) -> str:
    extra, missing = Counter(recorded) - Counter(configured), Counter(configured) - Counter(recorded)
    parts = [
        f"{whose}: {_words(words)}"
        for whose, words in (("the run's has", extra), ("the configured one has", missing))
        if words
    ]
    return "; ".join(parts) or "the same words in another order"


def _words(words: Counter[str]) -> str:
    listed = list(words.elements())
    more = f" and {len(listed) - MAX_SHOWN} more" if len(listed) > MAX_SHOWN else ""
    return " ".join(_shown(word) for word in listed[:MAX_SHOWN]) + more


def _shown(word: str) -> str:
    """A recorded word as a refusal may show it, in a terminal or in Slack's mrkdwn: no markup, no mention."""
    return _UNSHOWN.sub("?", word)[:60]


@dataclass(frozen=True)
class RerunOutcome:
    run_id: str
    original_id: str
    placement: Placement
    finished: pb.RunFinished
    comparison: dict[str, Any]  # {"verdict", "original", "rerun", "differences", "why"}


@dataclass(frozen=True)
class PlacedRerun:
    run_id: str
    original_id: str
    request: pb.StartRunRequest | None  # None: started already, by a bot that has stopped since
    provider: Provider
    placement: Placement


async def rerun_isolated(
    core: Coordinator,
    run_id: str,
    requested_by: str,
    on_event: EventCallback,
    *,
    via: str = "cli",
    place: str = "",
    on_started: Started | None = None,
) -> RerunOutcome:
    """Checks everything that can be checked first (Refused: nothing was started), then places, runs,
    follows and compares. The placement is released however the rerun ends, a cancelled task included."""
    placed = await place_rerun(core, run_id, requested_by, via=via, place=place)
    try:
        if on_started is not None:
            await on_started(placed.run_id, placed.placement)
    except BaseException:
        await asyncio.shield(placed.provider.release(placed.placement))
        raise
    return await finish_rerun(core, placed.run_id, on_event, placed)  # no await between: release is certain


async def place_rerun(
    core: Coordinator, run_id: str, requested_by: str, *, via: str = "cli", place: str = ""
) -> PlacedRerun:
    """Checks the rerun, gets it a runner and records it (with what ends its placement); nothing runs yet."""
    store = core.store
    original = await store.call(Store.get_run, run_id)
    if original.rerun_of:
        raise Refused(f"run {original.id} is itself a rerun of {original.rerun_of}; rerun that one")
    argv = configured_launch(core.config, original)
    try:
        bundle = await store.call(export_bundle, original.id)
        provider = make_provider(core.config, core.config.cluster(original.cluster))
    except (BundleError, ConfigError, IsolationError) as exc:
        raise Refused(f"{exc}; nothing was started") from None
    size = len(bundle.to_bytes())
    if size > MAX_BUNDLE_BYTES:
        raise Refused(
            f"the bundle of run {original.id} is {size} bytes, over the limit of {MAX_BUNDLE_BYTES} bytes; "
            "nothing was started"
        )
    body = bundle.request_body()
    if body is None:  # the runner kept only the body's sha256 (request_bodies = "hash"): this store has it
        body = json.loads(original.request_json or "{}").get("request") or None
    if body is None:
        raise Refused(
            f'the bundle of run {original.id} keeps only the request body\'s sha256 (request_bodies = "hash") '
            "and this store has no body for it; nothing was started"
        )
    rerun_id = new_run_id()
    request = rerun_request(bundle, rerun_id, requested_by, body, argv=argv)
    try:
        placement = await provider.acquire(rerun_id)
    except IsolationError as exc:
        raise Refused(f"{exc}; nothing was run") from None
    try:
        await store.call(
            Store.create_rerun,
            rerun_id,
            original,
            runner=placement.address,
            requested_by=requested_by,
            image=request.image,
            request_json=json.dumps({**json.loads(original.request_json or "{}"), "argv": list(request.launch_argv)}),
            provider=placement.provider,
            placement=placement.where,
            handle=placement.handle,
            bundle_sha256=bundle.sha256,
        )
        await store.call(
            Store.audit, requested_by, "rerun", original.id, f"rerun {rerun_id} on {placement.where}", via, place
        )
    except BaseException:
        await asyncio.shield(provider.release(placement))
        raise
    return PlacedRerun(rerun_id, original.id, request, provider, placement)


async def finish_rerun(
    core: Coordinator, rerun_id: str, on_event: EventCallback, placed: PlacedRerun | None = None
) -> RerunOutcome:
    """Follows a rerun to its end (starting it, when just placed; else resuming what a bot that stopped had
    started), releases its placement however that ends, and compares it with its original."""
    store = core.store
    if placed is None:
        placed = await _stored(core, rerun_id)
    placement = placed.placement
    try:
        live = await start_placed(core, placed, on_event) if placed.request is not None else None
        finished = await follow_run(core.config, store, rerun_id, placement.address, on_event, live=live)
    finally:
        await asyncio.shield(placed.provider.release(placement))
        if placement.handle:  # a job of its own: releasing it ended the run, even if we did not see the end
            await store.call(Store.close_if_active, rerun_id, f"the bot stopped following; {placement.where} was ended")
    original, events = await store.call(Store.events, placed.original_id), await store.call(Store.events, rerun_id)
    comparison = compare(original, events)
    if finished.status != pb.RUN_STATUS_COMPLETED:
        status = member(RunStatus, finished.status)
        comparison = {**comparison, "verdict": None, "why": f"the rerun ended {status}: {finished.summary}"}
    await store.call(Store.record_verdict, rerun_id, comparison["verdict"] or "", json.dumps(comparison))
    return RerunOutcome(rerun_id, placed.original_id, placement, finished, comparison)


async def start_placed(core: Coordinator, placed: PlacedRerun, on_event: EventCallback) -> LiveStream:
    """Starts the placed rerun the way a run starts (`accept`: StartRun, kept open after the first event, which is
    stored and shown); `follow_run` reads on from the stream returned. A refusal is the rerun's recorded error."""
    assert placed.request is not None
    try:
        first, live = await accept(core.config, placed.placement.address, placed.request)
    except RunRefused as exc:
        await core.store.call(Store.finish_run, placed.run_id, RunState.ERROR, str(exc))
        raise
    try:
        stored = await core.store.call(Store.add_event, first)
        if stored is not None:  # redacted by the store, as every event shown
            await on_event(stored)
    except BaseException:
        await live.close()
        raise
    return live


async def _stored(core: Coordinator, rerun_id: str) -> PlacedRerun:
    """A rerun as the store recorded it when it was placed (IsolationError/ConfigError: its provider is gone)."""
    run, link = await core.store.call(Store.get_run, rerun_id), await core.store.call(Store.get_rerun, rerun_id)
    provider = make_provider(core.config, core.config.cluster(run.cluster))
    placement = Placement(link.provider, run.runner, link.placement, link.handle or "")
    return PlacedRerun(rerun_id, link.original_id, None, provider, placement)


def rerun_request(
    bundle: Bundle, rerun_id: str, requested_by: str, body: str | None = None, *, argv: Sequence[str] = ()
) -> pb.StartRunRequest:
    """The bundle as a StartRun: `argv` (the cluster's configured command, configured_launch: never the
    bundle's, which is redacted and may be anyone's; none, and the runner refuses the run), the same request
    (`body`: the bundle's, or the store's when the bundle keeps only its sha256), the image by the digest the
    scene pinned (a tag can move between the failure and the rerun), the original's change log."""
    launch, asked = bundle.launch, bundle.json("request.json")
    digest = launch["image_digest"]
    image = launch["image"]
    if digest:
        image = pinned_to(image, digest)
    changes = (bundle.fingerprint or {}).get("changes") or []
    return pb.StartRunRequest(
        run_id=rerun_id,
        cluster=launch["cluster"],
        image=image,
        launch_argv=list(argv),
        request=pb.FixedRequest(
            api=asked["api"],
            body_json=body if body is not None else bundle.request_body() or "",
            repeats=asked["repeats"],
        ),
        profile=launch["profile"],
        requested_by=requested_by,
        changes=[pb.Change(at=c.get("at", ""), what=c.get("what", ""), by=c.get("by", "")) for c in changes],
        rerun=pb.Rerun(original_run_id=bundle.run["id"], bundle_sha256=bundle.sha256, image_digest=digest),
    )


def compare(original: list[pb.RunEvent], rerun: list[pb.RunEvent]) -> dict[str, Any]:
    """The verdict from two runs' events, with the environment differences that matter."""
    first, second = RunRecord.replay("", original), RunRecord.replay("", rerun)
    before, after = first.failure(), second.failure()
    differences = environment_differences(first.scene, second.scene)
    if before is None and after is None:
        verdict, why = RerunVerdict.REPRODUCED, "neither run failed"
    elif after is None:
        verdict = RerunVerdict.NOT_REPRODUCED
        why = "the isolated run passes where the original failed: suspect the environment"
    elif before is not None and _same(before, after):
        verdict = RerunVerdict.REPRODUCED
        why = f"same phase ({after['phase']}) and first-error signature: the cause travels with software and config"
    else:
        verdict, why = RerunVerdict.DIFFERENT_FAILURE, f"a different first error, in {after['phase']}: a new candidate"
    return {"verdict": verdict, "why": why, "original": before, "rerun": after, "differences": differences}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["phase"] == b["phase"] and a["signature"] == b["signature"])


def environment_differences(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The fingerprint diff's `matters` group, plus the GPU memory other processes held (which the diff counts
    as noise for pids, but which is exactly what makes a secondary OOM)."""
    if a is None or b is None:
        return [{"path": "fingerprint", "a": a is not None, "b": b is not None}]
    found = [{"path": d["path"], "a": d["a"], "b": d["b"]} for d in diff(a, b)["differences"] if d["kind"] == "matters"]
    holders = (_holders(a), _holders(b))
    if holders[0] != holders[1]:
        found.append({"path": "nvml.processes (foreign GPU memory)", "a": holders[0], "b": holders[1]})
    return found


def _holders(scene: dict[str, Any]) -> str:
    processes = (scene.get("nvml") or {}).get("processes") or []
    if not processes:
        return "none"
    pids = sorted({p["pid"] for p in processes})
    mib = sum(p.get("used_memory_mib") or 0 for p in processes)
    return f"{len(pids)} process(es) holding {mib} MiB on {len(processes)} GPU slot(s)"


def verdict_lines(outcome: RerunOutcome) -> list[str]:
    """The verdict as a person reads it (terminal and Slack)."""
    c = outcome.comparison
    head = f"isolated rerun {outcome.run_id} of {outcome.original_id} ({outcome.placement.where}): "
    lines = [head + (c["verdict"] or "no verdict") + f" — {c['why']}"]
    for label, failure in (("original", c["original"]), ("rerun", c["rerun"])):
        if failure:
            lines.append(f"  {label}: {failure['phase']} [{failure['category']}] {failure['signature']}")
        else:
            lines.append(f"  {label}: no failure")
    if c["differences"]:
        lines.append("  environment differences that matter (original → isolated):")
        lines += [f"    {d['path']}: {json.dumps(d['a'])} → {json.dumps(d['b'])}" for d in c["differences"]]
    else:
        lines.append("  no environment difference that matters")
    return lines
