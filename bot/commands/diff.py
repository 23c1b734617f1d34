"""`k3repro diff A B [--json]`: what differs between two fingerprints, what matters apart from noise."""

from __future__ import annotations

import argparse
import json

from bot.commands.common import CommandError
from runner.fingerprint import FingerprintError, diff, diff_text, load_fingerprint


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "diff",
        help="field-level differences between two fingerprints (driver, CUDA, digest, versions, GPUs, env)",
        description="Exit 0 when both are the same scene (equal sha256), 1 when they differ, 2 on bad input.",
    )
    parser.add_argument("a", metavar="A", help="fingerprint file")
    parser.add_argument("b", metavar="B", help="fingerprint file")
    parser.add_argument("--json", action="store_true", help="print the differences as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        a, b = load_fingerprint(args.a), load_fingerprint(args.b)
    except FingerprintError as exc:
        raise CommandError(str(exc)) from None
    result = diff(a, b)
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else diff_text(result))
    return 0 if result["same_scene"] else 1
