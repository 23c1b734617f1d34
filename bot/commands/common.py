"""What the terminal commands share: loading the config, the bot core, printing events, one-line errors."""

from __future__ import annotations

import getpass
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TextIO

from bot.config import BotConfig, check_tls, config_path, load_bot_config
from bot.coordinator import Coordinator
from bot.render import TextRenderer
from bot.store import AsyncStore
from kernel.usage import CommandError as CommandError  # the commands' refusal, raised by host tools too
from protos import runner_pb2 as pb


def said(exc: BaseException) -> str:
    """An error's own message: a KeyError's str() quotes it, and stripping quotes off ate the message's own."""
    return str(exc.args[0]) if len(exc.args) == 1 else str(exc)


def load_config(path: Path | None) -> BotConfig:
    return load_bot_config(config_path(path))


def operator() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


@asynccontextmanager
async def coordinator(config: BotConfig) -> AsyncIterator[Coordinator]:
    check_tls(config.tls)
    store = AsyncStore(config.store, config.retention)
    try:
        yield Coordinator(config, store)
    finally:
        store.close()


class EventPrinter:
    """Prints each event as it arrives (the callback of a followed run)."""

    def __init__(self, out: TextIO | None = None, *, logs: bool = False) -> None:
        self.out = out or sys.stdout  # looked up now: a redirected stdout (a test, a wrapper) is where lines go
        self.renderer = TextRenderer(logs=logs)

    async def __call__(self, event: pb.RunEvent) -> None:
        for line in self.renderer.lines(event):
            print(line, file=self.out, flush=True)

    async def reconnecting(self, problem: str) -> None:
        print(f"           (stream lost: {problem}; resuming)", file=self.out, flush=True)
