"""`k3repro-runner serve --config runner.toml`: the daemon on a GPU host."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from runner.config import RunnerConfig, load_runner_config
from runner.daemon import RunnerDaemon
from runner.toml_reader import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="k3repro-runner", description="k3repro runner daemon for a GPU host")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the Runner gRPC service")
    serve.add_argument("--config", type=Path, required=True, help="runner.toml")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_runner_config(args.config)
    except ConfigError as exc:
        print(f"k3repro-runner: {exc}", file=sys.stderr)
        return 2
    asyncio.run(_serve(config))
    return 0


async def _serve(config: RunnerConfig) -> None:
    """The daemon is built inside the event loop: gRPC's aio server binds to the loop that creates it."""
    await RunnerDaemon(config).serve_until_signalled()


if __name__ == "__main__":
    sys.exit(main())
