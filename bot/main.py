"""`k3repro-bot`: the bot process. `serve` runs the Slack bot; `resume` only follows the active runs to their end."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from bot.config import config_path, load_bot_config
from bot.coordinator import Coordinator
from bot.rerun import RerunOutcome, verdict_lines
from bot.resume import Shown, resume_active
from bot.store import AsyncStore, Run
from protos import runner_pb2 as pb
from runner.toml_reader import ConfigError

log = logging.getLogger("k3repro.bot")


async def resume_all(config_file: Path) -> int:
    """Follows every run the store holds as active until each ends (what a restarted bot does first)."""
    config = load_bot_config(config_file)
    store = AsyncStore(config.store)
    try:
        return 0 if await resume_runs(Coordinator(config, store)) else 1
    finally:
        store.close()


async def resume_runs(core: Coordinator) -> bool:
    """Every active run to its end, each event and verdict logged (the one resume path, bot/resume.py).
    False when some run could not be followed."""
    follows = await resume_active(core, _logged)
    log.info("resuming %d active run(s)", len(follows))
    return all(await asyncio.gather(*follows.values()))


async def _logged(run: Run) -> Shown:
    async def note(event: pb.RunEvent) -> None:
        log.info("run %s seq %d %s", run.id, event.seq, event.WhichOneof("payload"))

    async def verdict(outcome: RerunOutcome) -> None:
        log.info("rerun %s of %s: %s", run.id, run.rerun_of, " ".join(verdict_lines(outcome)))

    return Shown(on_event=note, verdict=verdict)


async def serve(config_file: Path) -> int:
    """The Slack bot until SIGTERM/SIGINT; runs keep going on their runners and are resumed by the next start."""
    from bot.web import serving  # Slack libraries only where the Slack bot runs

    config = load_bot_config(config_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with serving(config, ready=False) as served:
        mode = "Socket Mode and HTTP" if served.bot.settings.app_token else "HTTP"
        log.info("k3repro bot serving (%s) on port %d", mode, served.port)
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({stopping, served.started}, return_when=asyncio.FIRST_COMPLETED)
        if served.started.done():
            served.started.result()  # a start that failed for good (a refused token) ends the bot: one line
            await stopping
        stopping.cancel()
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
