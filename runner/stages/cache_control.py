"""The fresh-cache control: does a failure follow the host's caches?

A stale or half-written compile, JIT or remote-code cache makes "a different error on every start", or one that
repeats in engine_init exactly like a software bug. When the minimal launch's failure looks like that
(runner/data/cache_control.toml), the method launches it ONCE more with every cache of kernel/data/caches.toml
moved to a new, empty folder in the run's work dir (the backend decides where: EngineBackend.launch). The host's
caches are never touched. If that launch answers, the host's cache is stale: clear it; if it fails the same way,
the caches are ruled out. The answer is the checklist item caches_not_stale.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kernel.fingerprint.caches import caches_section
from kernel.redact import redactor
from kernel.toml_reader import packaged
from kernel.vllm_cli import ServeCommand, flag_table
from protos import runner_pb2 as pb
from protos.vocab import UNKNOWN_PHASE
from runner.stages import proxies
from runner.stages.context import NOT_FAILED, Attempt, RunContext
from runner.stages.launcher import launch, release

SOURCE = "minimal_launch/fresh-caches"
HOLDS, FAILS, PENDING = pb.CHECKLIST_STATE_HOLDS, pb.CHECKLIST_STATE_FAILS, pb.CHECKLIST_STATE_PENDING


@dataclass(frozen=True)
class CacheRead:
    """An analyzer context in which caches are read: which, and the flag without which none is."""

    caches: tuple[str, ...]
    flag: str = ""

    def applies(self, command: ServeCommand) -> bool:
        return not self.flag or command.has(self.flag)


@cache
def _rules() -> tuple[frozenset[str], Mapping[str, CacheRead]]:
    """(phases, cache reads by context) from runner/data/cache_control.toml."""
    reader = packaged("cache_control.toml", "runner.data").only(("phases", "during"))
    during = {}
    for row in reader.rows("during"):
        row.only(("context", "caches", "flag"))
        read = CacheRead(tuple(row.texts("caches", required=True)), row.text("flag", ""))
        if read.flag:
            flag_table().resolve(read.flag)  # a flag the table does not know is named at once
        during[row.text("context")] = read
    return frozenset(reader.texts("phases", required=True)), during


def _read(attempt: Attempt, command: ServeCommand) -> CacheRead | None:
    """The cache read the attempt's failure was met in (None: none, or none this command makes)."""
    read = _rules()[1].get(attempt.during)
    return read if read is not None and read.applies(command) else None


def why(attempts: list[Attempt], command: ServeCommand) -> str:
    """Why these attempts call for the control ("" when they do not): the condition, in words."""
    failed = [a for a in attempts if a.failed and not a.foreign]
    phases = _rules()[0]
    moved = list(dict.fromkeys(a.phase for a in failed if a.phase != UNKNOWN_PHASE))  # unknown: no phase to move
    if len(moved) > 1:
        return f"the failure moves between phases ({', '.join(moved)})"
    if any(a.phase in phases for a in failed):
        return f"the failure is in {failed[0].phase}"
    if read := next((a.during for a in failed if _read(a, command)), ""):
        return f"the failure was met during {read}"
    return ""


async def run(ctx: RunContext, command: ServeCommand) -> None:
    """The control launch, when the attempts call for it; settles caches_not_stale either way it goes."""
    reason = why(ctx.evidence.attempts, command)
    if not reason:
        return
    failed = [a for a in ctx.evidence.attempts if a.failed and not a.foreign]
    target = failed[0]
    root = ctx.config.state_dir / "runs" / ctx.run_id / "fresh-caches"
    numbers = itertools.count(1)

    async def control() -> Attempt:
        folder = root / f"launch-{next(numbers)}"  # each launch its own empty caches: one never sees another's
        launched = await launch(ctx, command, SOURCE, fresh_caches=folder)
        await release(ctx)
        if launched.ready:
            return NOT_FAILED
        return launched.failure or Attempt.inconclusive(launched.summary)

    got = await proxies.repeat(ctx, target, control)
    answered = got.held
    surveyed = await asyncio.to_thread(caches_section, os.environ, redactor())  # now: the failures may have written
    suspects = stale_suspects(surveyed["caches"], _read(target, command))
    if answered:
        where = ", ".join(path for _, path in suspects) or "the engine's caches (kernel/data/caches.toml)"
        ctx.evidence.stale_caches = tuple(path for _, path in suspects)
        names = " and ".join(dict.fromkeys(name for name, _ in suspects))
        fresh = f"a fresh {names} cache starts" if names else "fresh caches start"
        state, evidence = (
            FAILS,
            f"{fresh}; the host's cache is stale: clear {where} (with new, empty caches the launch answers, where "
            f"with the host's caches {reason})",
        )
    elif got.foreign:
        state, evidence = PENDING, "the control launch started while other processes held GPU memory: not evidence"
    elif any(got.same_as(a) for a in failed):  # a failure that moves: one the host's caches also gave
        state, evidence = HOLDS, f"fails the same with fresh caches ({got.phase} [{got.category}]): not the caches"
    else:
        state, evidence = (
            PENDING,
            f"with fresh caches it fails differently ({got.phase} [{got.category}]), in a way no attempt with the "
            f"host's caches did ({target.phase} [{target.category}] first): not settled",
        )
    await ctx.artifact(
        "fresh_caches_control",
        {
            "why": reason,
            "outcome": "answered" if answered else f"failed in {got.phase} [{got.category}]",
            "finding": evidence,
            "suspects": [{"cache": name, "path": path} for name, path in suspects],
        },
    )
    await ctx.check(pb.CHECKLIST_ID_CACHES_NOT_STALE, state, evidence)


def stale_suspects(caches: list[dict[str, Any]], read: CacheRead | None) -> list[tuple[str, str]]:
    """(cache name, redacted path) of the caches a stale-cache finding names, from a survey of them
    (kernel/fingerprint/caches.py): those the failure's context points at (the ones holding anything first), else
    every one that holds anything."""
    located = [c for c in caches if c.get("path")]
    held = [c for c in located if c.get("exists") and c.get("entries")]
    named = read.caches if read is not None else ()
    pointed = [c for c in held if c.get("name") in named] or [c for c in located if c.get("name") in named]
    return [(str(c["name"]), str(c["path"])) for c in pointed or held]
