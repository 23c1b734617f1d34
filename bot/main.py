"""`k3repro-bot`: the bot process. Today it resumes runs after a restart; the Slack front-end plugs in here."""

from __future__ import annotations

import argparse
import asyncio
import logging
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="k3repro-bot", description="k3repro bot process")
    parser.add_argument("--config", type=Path, help="bot config (default: $K3REPRO_CONFIG or ./k3repro.toml)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("resume", help="follow every active run in the store until it ends")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(resume_all(config_path(args.config)))
    except ConfigError as exc:
        print(f"k3repro-bot: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
