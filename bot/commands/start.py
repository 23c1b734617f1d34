"""`k3repro start CLUSTER`: start a run and follow it live; `k3repro watch RUN`: follow it again."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from bot.commands.analyze import MAX_BYTES
from bot.commands.common import CommandError, EventPrinter, coordinator, load_config, operator, said
from bot.consumer import RunLost, RunRefused
from bot.coordinator import Coordinator
from bot.refusal import Refused
from bot.store import RunNotFound, Store
from kernel.analyzer import InputError, analyze_path
from kernel.analyzer.messages import first_error_message
from kernel.analyzer.progress import ProgressLine
from protos import runner_pb2 as pb


def run_start(args: argparse.Namespace) -> int:
    try:  # the deployment's log is read before anything starts: an interrupt here leaves nothing behind
        failed = _deployment_error(args.log) if args.log else None
    except KeyboardInterrupt:
        print("\ninterrupted: nothing started")
        return 130
    where = Progress()
    return _detachable(_start(args, failed, where), where)


def run_watch(args: argparse.Namespace) -> int:
    return _detachable(_watch(args), Progress(starting=True, run_id=args.run))


@dataclass
class Progress:
    """How far a start got, for what an interrupt says: nothing yet, a start under way, or a run."""

    starting: bool = False
    run_id: str = ""


def _detachable(work: Coroutine[Any, Any, int], where: Progress) -> int:
    try:
        return asyncio.run(work)
    except KeyboardInterrupt:
        print(f"\n{interrupted(where)}")
        return 130


def interrupted(where: Progress) -> str:
    if where.run_id:
        return f"detached: the run goes on as {where.run_id}; follow it with `k3repro watch {where.run_id}`"
    if where.starting:  # the runner may have accepted it as the interrupt came
        return "interrupted while the run was being started: `k3repro runs` shows whether it was"
    return "interrupted: nothing started"


async def _start(args: argparse.Namespace, failed: pb.FirstError | None, where: Progress) -> int:
    config = load_config(args.config)
    printer = EventPrinter(logs=args.logs)
    async with coordinator(config) as core:
        where.starting = True
        try:
            started = await core.start(
                args.cluster, operator(), profile=args.profile, image=args.image, deployment_error=failed
            )
        except Refused as exc:
            raise CommandError(str(exc)) from None
        where.run_id = started.run_id
        print(f"run {started.run_id} · cluster {args.cluster} · runner {started.runner}", flush=True)
        try:
            finished = await core.follow(started, printer, printer.reconnecting)
        except (RunRefused, RunLost) as exc:
            raise CommandError(str(exc)) from None
    return 0 if finished.status == pb.RUN_STATUS_COMPLETED else 1


async def _watch(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    printer = EventPrinter(logs=args.logs)
    async with coordinator(config) as core:
        try:
            run = await core.store.call(Store.get_run, args.run)
        except RunNotFound as exc:
            raise CommandError(said(exc)) from None
        if ended := await _ended(core, run.id, printer):  # nothing left to follow: its result, as it ended
            return 0 if ended.status == pb.RUN_STATUS_COMPLETED else 1
        try:
            finished = await core.resume(run.id, printer, printer.reconnecting)
        except (RunRefused, RunLost, LookupError) as exc:
            raise CommandError(said(exc)) from None
    return 0 if finished.status == pb.RUN_STATUS_COMPLETED else 1


async def _ended(core: Coordinator, run_id: str, printer: EventPrinter) -> pb.RunFinished | None:
    """A run whose end the store holds: the lines a live watch ends with (its run_finished event's), printed;
    None for a run still going."""
    events = await core.store.call(Store.events, run_id)
    if not events or not events[-1].HasField("run_finished"):
        return None
    for event in events[:-1]:  # the renderer reads the whole run, as a live watch's did
        printer.renderer.lines(event)
    print(f"run {run_id} has ended; its result:", file=printer.out)
    await printer(events[-1])
    return events[-1].run_finished


def _deployment_error(path: str) -> pb.FirstError:
    """The first error of the deployment's log, or a one-line refusal (nothing is started)."""
    try:
        with ProgressLine(f"reading {path}", sys.stderr) as progress:
            analysis = analyze_path(path, max_bytes=MAX_BYTES, progress=progress)
    except InputError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror or exc}") from None
    if analysis.first_error is None:
        raise CommandError(f"{path}: the log shows no error to reproduce; nothing was started")
    return first_error_message(analysis.first_error)
