"""`k3repro minimize RUN`: shrink a finished run's flags to a 1-minimal set that still fails the same way."""

from __future__ import annotations

import argparse
import asyncio

from bot.commands.common import CommandError, EventPrinter, coordinator, load_config, operator, said
from bot.commands.start import Progress, interrupted
from bot.consumer import RunLost, RunRefused
from bot.minimize import start_minimize
from bot.record import RunRecord, StageResult
from bot.refusal import Refused
from bot.rerun import command_line
from bot.store import RunNotFound, Store
from protos import runner_pb2 as pb
from protos.vocab import StageStatus


def run(args: argparse.Namespace) -> int:
    where = Progress()
    try:
        return asyncio.run(_minimize(args, where))
    except KeyboardInterrupt:
        print(f"\n{interrupted(where)}")
        return 130


async def _minimize(args: argparse.Namespace, where: Progress) -> int:
    config = load_config(args.config)
    printer = EventPrinter(logs=args.logs)
    async with coordinator(config) as core:
        where.starting = True
        try:
            started = await start_minimize(core, args.run, operator())
        except (Refused, RunNotFound) as exc:
            raise CommandError(said(exc)) from None
        where.run_id = started.run_id
        print(f"minimize run {started.run_id} of {args.run} · runner {started.runner}")
        print(f"launches: {command_line(started.request.launch_argv)}", flush=True)
        try:
            finished = await core.follow(started, printer, printer.reconnecting)
        except (RunRefused, RunLost) as exc:
            raise CommandError(str(exc)) from None
        record = RunRecord.replay(started.run_id, await core.store.call(Store.events, started.run_id))
    shrunk = any(
        isinstance(s, StageResult) and s.stage == "minimize" and s.status == StageStatus.OK for s in record.steps
    )
    return 0 if finished.status == pb.RUN_STATUS_COMPLETED and shrunk else 1
