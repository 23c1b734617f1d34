"""`k3repro check --baseline PROFILE [--fingerprint FILE] [--json]`: a scene against a compatibility baseline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bot.commands.common import CommandError
from bot.commands.fingerprint import add_target_options, take
from runner.baseline import load_baseline, report_text
from runner.fingerprint import FingerprintError, load_fingerprint


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "check",
        help="check a fingerprint against a model's compatibility baseline (e.g. kimi-k3)",
        description="Exit 0 when the verdict is pass or warn, 1 when it is fail, 2 on bad input.",
    )
    parser.add_argument("--baseline", required=True, metavar="PROFILE", help="baseline profile, e.g. kimi-k3")
    parser.add_argument("--fingerprint", metavar="FILE", help="a saved fingerprint (default: take one now)")
    parser.add_argument(
        "--profiles-dir", type=Path, action="append", default=[], metavar="DIR",
        help="also look for PROFILE.toml here (before the shipped profiles); repeatable",
    )  # fmt: skip
    add_target_options(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON (stable contract)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    baseline = load_baseline(args.baseline, tuple(args.profiles_dir))
    if args.fingerprint and (args.image or args.python):
        raise CommandError("--fingerprint reads a saved scene; --image/--python take a new one: give one of them")
    try:
        scene = load_fingerprint(args.fingerprint, unsealed_ok=True) if args.fingerprint else take(args)
    except FingerprintError as exc:
        raise CommandError(str(exc)) from None
    report = baseline.evaluate(scene)
    print(json.dumps(report, indent=2, ensure_ascii=False) if args.json else report_text(report))
    return 1 if report["verdict"] == "fail" else 0
