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


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("rerun", help="rerun a run's frozen case on an isolated node; prints the verdict")
    parser.add_argument("run")
    parser.add_argument(
        "--isolated", action="store_true", required=True, help="on a runner from the cluster's isolation provider"
    )
    parser.add_argument("--logs", action="store_true", help="also print the engine's log as it arrives")
    parser.set_defaults(func=run)


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
