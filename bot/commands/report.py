"""`k3repro report RUN`: the hand-off report (Markdown) of a run, to stdout or a file (bot/handoff.py)."""

from __future__ import annotations

import argparse
import sys

from bot.commands.common import CommandError, load_config
from bot.handoff import run_handoff
from bot.store import RunNotFound, Store


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
