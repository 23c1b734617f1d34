"""`k3repro start CLUSTER`: start a run and follow it live; `k3repro watch RUN`: follow it again."""

from __future__ import annotations

import argparse
import asyncio

from bot.commands.analyze import MAX_BYTES
from bot.commands.common import CommandError, EventPrinter, coordinator, load_config, operator
from bot.consumer import RunLost, RunRefused
from bot.refusal import Refused
from protos import runner_pb2 as pb
from runner.analyzer import InputError, analyze_path
from runner.analyzer.messages import first_error_message


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    start = sub.add_parser("start", help="start a run on a cluster and follow it live")
    start.add_argument("cluster")
    start.add_argument("--logs", action="store_true", help="also print the engine's log as it arrives")
    start.add_argument(
        "--log",
        metavar="FILE",
        help="the failing deployment's own log: its first error is recorded by freeze and compared in the verdict",
    )
    start.set_defaults(func=run_start)
    watch = sub.add_parser("watch", help="follow a run again, from where this store stopped")
    watch.add_argument("run")
    watch.add_argument("--logs", action="store_true")
    watch.set_defaults(func=run_watch)


def run_start(args: argparse.Namespace) -> int:
    return _detachable(_start(args))


def run_watch(args: argparse.Namespace) -> int:
    return _detachable(_watch(args))


def _detachable(work: object) -> int:
    try:
        return asyncio.run(work)  # type: ignore[arg-type]
    except KeyboardInterrupt:
        print("\ndetached; the run goes on on its runner (k3repro watch RUN / k3repro cancel RUN)")
        return 130


async def _start(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    failed = _deployment_error(args.log) if args.log else None
    printer = EventPrinter(logs=args.logs)
    async with coordinator(config) as core:
        try:
            started = await core.start(args.cluster, operator(), deployment_error=failed)
        except Refused as exc:
            raise CommandError(str(exc)) from None
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
            finished = await core.resume(args.run, printer, printer.reconnecting)
        except (RunRefused, RunLost, LookupError) as exc:
            raise CommandError(str(exc).strip("'\"")) from None
    return 0 if finished.status == pb.RUN_STATUS_COMPLETED else 1


def _deployment_error(path: str) -> pb.FirstError:
    """The first error of the deployment's log, or a one-line refusal (nothing is started)."""
    try:
        analysis = analyze_path(path, max_bytes=MAX_BYTES)
    except InputError as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{path}: {exc.strerror or exc}") from None
    if analysis.first_error is None:
        raise CommandError(f"{path}: the log shows no error to reproduce; nothing was started")
    return first_error_message(analysis.first_error)
