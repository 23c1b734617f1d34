"""`k3repro note CLUSTER what changed` (one word or many, as Slack's `note CLUSTER TEXT`): the cluster's change log, which every run's freeze records."""

from __future__ import annotations

import argparse
import asyncio

from bot import rich
from bot.answers import noted
from bot.commands.common import CommandError, coordinator, load_config, operator
from bot.refusal import Refused


def run(args: argparse.Namespace) -> int:
    async def note() -> str:
        async with coordinator(load_config(args.config)) as core:
            change = await core.note(args.cluster, " ".join(args.text), operator())
        return rich.plain(noted(change))

    try:
        print(asyncio.run(note()))
    except Refused as exc:
        raise CommandError(str(exc)) from None
    return 0
