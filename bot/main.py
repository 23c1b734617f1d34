"""`k3repro-bot`: the bot process. `serve` runs the Slack bot; `resume` only follows the active runs to their end."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from bot.config import config_path, load_bot_config
from bot.consumer import RunLost, RunRefused
from bot.coordinator import Coordinator
from bot.store import ACTIVE, AsyncStore, Store
from protos import runner_pb2 as pb
from protos.vocab import to_id
from runner.toml_reader import ConfigError

log = logging.getLogger("k3repro.bot")


async def resume_all(config_file: Path) -> int:
    """Follows every run the store holds as active until each ends (what a restarted bot does first)."""
    config = load_bot_config(config_file)
    store = AsyncStore(config.store)
    core = Coordinator(config, store)
    active = await store.call(Store.runs, 10_000, ACTIVE)
    log.info("resuming %d active run(s)", len(active))

    async def one(run_id: str) -> bool:
        async def note(event: pb.RunEvent) -> None:
            log.info("run %s seq %d %s", run_id, event.seq, event.WhichOneof("payload"))

        try:
            finished = await core.resume(run_id, note)
        except (RunLost, RunRefused) as exc:
            log.error("run %s: %s", run_id, exc)
            return False
        log.info("run %s finished: %s", run_id, to_id(pb.RunStatus, finished.status))
        return True

    try:
        results = await asyncio.gather(*(one(run["id"]) for run in active))
    finally:
        store.close()
    return 0 if all(results) else 1


async def serve(config_file: Path) -> int:
    """The Slack bot until SIGTERM/SIGINT; runs keep going on their runners and are resumed by the next start."""
    from bot.web import serving  # Slack libraries only where the Slack bot runs

    config = load_bot_config(config_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serving(config) as served:
        mode = "Socket Mode and HTTP" if served.bot.settings.app_token else "HTTP"
        log.info("k3repro bot serving (%s) on port %d", mode, served.port)
        await stop.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="k3repro-bot", description="k3repro bot process")
    parser.add_argument("--config", type=Path, help="bot config (default: $K3REPRO_CONFIG or ./k3repro.toml)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("resume", help="follow every active run in the store until it ends")
    sub.add_parser("serve", help="run the Slack bot: HTTP (and Socket Mode with an app token), /healthz, /metrics")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    work = serve if args.command == "serve" else resume_all
    try:
        return asyncio.run(work(config_path(args.config)))
    except ConfigError as exc:
        print(f"k3repro-bot: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
