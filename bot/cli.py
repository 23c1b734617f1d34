"""`k3repro`: the terminal front-end of the bot core."""

from __future__ import annotations

import argparse
import functools
import sqlite3
import sys
from pathlib import Path

from bot.commands import analyze, bundle, check, demo, dev_certs, diff, fingerprint, minimize, note, rerun, runs, start
from bot.commands.common import CommandError
from bot.config import CONFIG_ENV, DEFAULT_CONFIG
from bot.store import StoreUnavailable
from runner.toml_reader import ConfigError

COMMANDS = (start, runs, note, rerun, minimize, bundle, demo, dev_certs, analyze, fingerprint, check, diff)


@functools.cache  # built once: argparse looks up a translation on disk for every help text it adds
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="k3repro", description="Reproduce vLLM serving failures one change at a time."
    )
    parser.add_argument("--config", type=Path, help=f"bot config (default: ${CONFIG_ENV} or ./{DEFAULT_CONFIG})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
    except (CommandError, ConfigError, StoreUnavailable) as exc:
        print(f"k3repro: {exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:  # a full or read-only disk, a file that is not a store
        print(f"k3repro: the run store cannot be used: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
