"""`k3repro rerun RUN --isolated`: replay a run's frozen bundle on an isolated runner and print the verdict."""

from __future__ import annotations

import argparse
import asyncio
import json

from bot.commands.common import CommandError, EventPrinter, coordinator, load_config, operator, said
from bot.consumer import RunLost
from bot.isolation import Placement
from bot.refusal import Refused
from bot.rerun import command_line, rerun_isolated, verdict_lines
from bot.store import RunNotFound, Store


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_rerun(args))
    except KeyboardInterrupt:
        print("\ninterrupted: a Slurm or Kubernetes job was ended with its run; a standing isolated runner goes on")
        return 130


async def _rerun(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    printer = EventPrinter(logs=args.logs)

    async with coordinator(config) as core:

        async def started(rerun_id: str, placement: Placement) -> None:
            recorded = json.loads((await core.store.call(Store.get_run, rerun_id)).request_json)  # redacted
            print(f"isolated rerun {rerun_id} of {args.run} · {placement.where} · {placement.address}")
            print(f"launches: {command_line(recorded['argv'])}", flush=True)

        try:
            outcome = await rerun_isolated(core, args.run, operator(), printer, on_started=started)
        except (Refused, RunLost, RunNotFound) as exc:
            raise CommandError(said(exc)) from None
    print()
    for line in verdict_lines(outcome):
        print(line)
    return 0 if outcome.comparison["verdict"] else 1
