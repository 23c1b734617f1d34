"""`k3repro report RUN`: the hand-off report (Markdown) of a run, to stdout or a file (bot/handoff.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bot.commands.common import CommandError, load_config
from bot.handoff import run_handoff
from bot.store import RunNotFound, Store


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("report", help="write a run's hand-off report: one Markdown document to act on")
    parser.add_argument("run")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write it to FILE instead of stdout")
    parser.set_defaults(func=write_report)


def write_report(args: argparse.Namespace) -> int:
    store = Store(load_config(args.config).store)
    try:
        text = run_handoff(store, args.run)
    except RunNotFound as exc:
        raise CommandError(str(exc)) from None
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise CommandError(f"cannot write the report {args.output}: {exc.strerror or exc}") from None
    print(f"hand-off report of {args.run} written to {args.output}", file=sys.stderr)
    return 0
