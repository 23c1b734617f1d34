"""The one resume path: every run the store holds as active, followed to its end by a bot that starts again.

A plain run continues from its last stored event (Coordinator.resume); an isolated rerun is followed, its
placement released and its verdict drawn (rerun.finish_rerun). A front-end adds only what it shows of each
run (`Shown`): `k3repro-bot resume` logs, the Slack bot renders into the run's thread.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from bot.consumer import EventCallback, RunLost, RunRefused
from bot.coordinator import Coordinator
from bot.isolation import IsolationError
from bot.rerun import RerunOutcome, finish_rerun
from bot.store import Run, Store
from kernel.toml_reader import ConfigError
from protos.vocab import RunStatus, member

log = logging.getLogger("k3repro.bot")

FOLLOW_ERRORS = (RunLost, RunRefused, IsolationError, ConfigError)  # a run that cannot be followed to its end


async def _nothing(_: Any) -> None:
    return None


@dataclass(frozen=True)
class Shown:
    """What a front-end does with one resumed run: each new event, an isolated rerun's verdict, and why the
    run could not be followed to its end (one of FOLLOW_ERRORS). Each does nothing unless given."""

    on_event: EventCallback = _nothing
    verdict: Callable[[RerunOutcome], Awaitable[None]] = _nothing
    failed: Callable[[Exception], Awaitable[None]] = _nothing


Front = Callable[[Run], Awaitable[Shown]]


async def resume_active(core: Coordinator, front: Front) -> dict[str, Coroutine[Any, Any, bool]]:
    """Asks `front` for every active run, in turn (Slack re-posts each thread before any run goes on), and
    returns each run's follow by its id, to be awaited: True when the run was followed to its end."""
    runs = await core.store.call(Store.active_runs)
    return {run.id: _follow(core, run, await front(run)) for run in runs}


async def _follow(core: Coordinator, run: Run, shown: Shown) -> bool:
    try:
        if run.rerun_of:
            outcome = await finish_rerun(core, run.id, shown.on_event)
            await shown.verdict(outcome)
            finished = outcome.finished
        else:
            finished = await core.resume(run.id, shown.on_event)
    except FOLLOW_ERRORS as exc:
        log.error("run %s: %s", run.id, exc)
        await shown.failed(exc)
        return False
    log.info("run %s finished: %s", run.id, member(RunStatus, finished.status))
    return True
