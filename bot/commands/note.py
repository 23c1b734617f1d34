"""`k3repro note CLUSTER "what changed"`: the cluster's change log, which every run's freeze records."""

from __future__ import annotations

import argparse
import asyncio

from bot.answers import noted
from bot.blocks import unmarked
from bot.commands.common import CommandError, coordinator, load_config, operator
from bot.refusal import Refused


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("note", help="add to a cluster's change log (time + what changed)")
    parser.add_argument("cluster")
    parser.add_argument("what", help="what changed, e.g. 'driver 580.82 -> 580.95 on gpu-a1'")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    async def note() -> str:
        async with coordinator(load_config(args.config)) as core:
            change = await core.note(args.cluster, args.what, operator())
        return unmarked(noted(change))

    try:
        print(asyncio.run(note()))
    except Refused as exc:
        raise CommandError(str(exc)) from None
    return 0
