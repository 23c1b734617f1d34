"""`k3repro check --baseline PROFILE [--fingerprint FILE] [--json]`: a scene against a compatibility baseline."""

from __future__ import annotations

import argparse
import json

from kernel.baseline import CheckStatus, load_baseline, report_text
from kernel.fingerprint import FingerprintError, load_fingerprint
from kernel.usage import CommandError
from runner.tools.fingerprint import take


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
    return 1 if report["verdict"] == CheckStatus.FAIL else 0
