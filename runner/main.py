"""`k3repro-runner serve --config runner.toml [--once] [--port-file PATH] [--check-config]`: the daemon on a GPU
host. `--config` may come before `serve` as well."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from kernel.toml_reader import ConfigError
from runner.config import RunnerConfig, load_runner_config
from runner.daemon import DaemonStartError, RunnerDaemon, check_start

CONFIG_HELP = "runner.toml"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="k3repro-runner", description="k3repro runner daemon for a GPU host")
    parser.add_argument("--config", type=Path, help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the Runner gRPC service")
    # SUPPRESS: given after `serve` it wins, not given there it leaves the one before `serve` alone
    serve.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=CONFIG_HELP)
    serve.add_argument(
        "--once", action="store_true", help="serve one run, then exit (an isolated runner inside a batch job)"
    )
    serve.add_argument(
        "--port-file", type=Path, help="write the bound port here once serving (how a scheduler's job tells the bot)"
    )
    serve.add_argument(
        "--check-config",
        action="store_true",
        help="load and check the config fully (TLS files included), say how it would serve, exit 0; serves nothing",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.config is None:
        parser.error("the following arguments are required: --config")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_runner_config(args.config)
    except ConfigError as exc:
        print(f"k3repro-runner: {exc}", file=sys.stderr)
        return 2
    try:
        if args.check_config:
            print(f"k3repro-runner: {args.config}: ok: {check_start(config)}")
            return 0
        asyncio.run(_serve(config, args.once, args.port_file))
    except DaemonStartError as exc:
        print(f"k3repro-runner: {exc}", file=sys.stderr)
        return 2
    return 0


async def _serve(config: RunnerConfig, once: bool, port_file: Path | None) -> None:
    """The daemon is built inside the event loop: gRPC's aio server binds to the loop that creates it."""
    daemon = RunnerDaemon(config)
    daemon.hub.once = once
    await daemon.serve_until_signalled(port_file)


if __name__ == "__main__":
    sys.exit(main())
