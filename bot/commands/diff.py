"""`k3repro diff A B [--json]`: what differs between two fingerprints, what matters apart from noise."""

from __future__ import annotations

import argparse
import json

from bot.commands.common import CommandError
from kernel.fingerprint import FingerprintError, diff, diff_text, load_fingerprint


def run(args: argparse.Namespace) -> int:
    try:
        a, b = load_fingerprint(args.a), load_fingerprint(args.b)
    except FingerprintError as exc:
        raise CommandError(str(exc)) from None
    result = diff(a, b)
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else diff_text(result))
    return 0 if result["same_scene"] else 1
