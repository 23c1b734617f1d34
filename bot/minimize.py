"""`minimize`: a run of its own that shrinks a finished run's flags to a 1-minimal set failing the same way.

The original run's ladder named the trigger step and its failure (phase, category, signature); the minimize
run launches what the original launched, on its cluster, and the runner's minimize stage does the search
(runner/stages/minimize.py). Slack's button and the CLI both start it here. "What the original launched" is
the cluster's configured command, unredacted, from this bot's config alone (bot/rerun.py, configured_launch):
never the store's redacted copy, never an imported bundle's; a run whose recorded command is not that one is
refused.
"""

from __future__ import annotations

import json
from typing import Any

from bot.coordinator import Coordinator, StartedRun
from bot.record import RunRecord
from bot.refusal import Refused
from bot.rerun import configured_launch
from bot.store import Store
from protos import runner_pb2 as pb
from protos.vocab import from_id


def minimize_target(record: RunRecord) -> pb.Minimize:
    """What a minimize run of `record` reproduces; Refused (one line) when there is nothing to shrink."""
    if not record.final:
        raise Refused(f"run {record.run_id} has not finished; minimize it once its ladder named a trigger")
    trigger = record.trigger
    if trigger is None:
        raise Refused(
            f"run {record.run_id} has no ladder step that triggered its failure (it failed before the ladder, or "
            "every step held): no flag to shrink"
        )
    if not trigger.phase or not trigger.signature:
        raise Refused(f"run {record.run_id}'s trigger step {trigger.step} recorded no phase and signature to reproduce")
    return pb.Minimize(
        original_run_id=record.run_id,
        step=trigger.step,
        phase=from_id(pb.Phase, trigger.phase),
        category=from_id(pb.ErrorCategory, trigger.category) if trigger.category else pb.ERROR_CATEGORY_UNSPECIFIED,
        signature=trigger.signature,
    )


async def start_minimize(
    core: Coordinator, run_id: str, requested_by: str, *, via: str = "cli", place: str = ""
) -> StartedRun:
    """Starts the minimize run of `run_id` on its cluster (returns once its runner accepted it)."""
    store = core.store
    original = await store.call(Store.get_run, run_id)
    if original.rerun_of:
        raise Refused(f"run {original.id} is an isolated rerun; minimize {original.rerun_of}, the run it replays")
    if original.minimize_of:
        raise Refused(f"run {original.id} is itself a minimize run of {original.minimize_of}")
    asked: dict[str, Any] = json.loads(original.request_json or "{}")
    argv = configured_launch(core.config, original)
    events = await store.call(Store.events, original.id)
    record = RunRecord.replay(original.id, events)
    record.status = original.status
    target = minimize_target(record)
    started = await core.start(
        original.cluster,
        requested_by,
        via,
        place=place,
        profile=str(asked.get("profile") or ""),
        image=original.image,
        argv=argv,
        fixed=pb.FixedRequest(
            api=str(asked.get("api") or ""),
            body_json=str(asked.get("request") or ""),
            repeats=int(asked.get("repeats") or 0),
        ),
        minimize=target,
    )
    try:
        await store.call(
            Store.audit, requested_by, "minimize", original.id, f"minimize run {started.run_id}", via, place
        )
    except BaseException:
        await started.abandon()
        raise
    return started
