"""`k3repro analyze PATH|- [--json] [--explain]`: the first error of a vLLM log, its phase, category and hint."""

from __future__ import annotations

import argparse
import json
import sys

from kernel.analyzer import InputError, analyze_path, analyze_stream
from kernel.analyzer.progress import ProgressLine

# Larger inputs are refused: a start-up log is megabytes, a long-running server's a few hundred; past
# this it is almost certainly the wrong file (the analysis itself streams, with flat memory).
MAX_BYTES = 1 << 30


def run(args: argparse.Namespace) -> int:
    try:
        with ProgressLine(f"k3repro analyze {args.path}", sys.stderr) as progress:
            if args.path == "-":
                analysis = analyze_stream(sys.stdin.buffer, "standard input", max_bytes=MAX_BYTES, progress=progress)
            else:
                analysis = analyze_path(args.path, max_bytes=MAX_BYTES, progress=progress)
    except InputError as exc:
        print(f"k3repro analyze: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"k3repro analyze: {args.path}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(analysis.to_json(explain=args.explain), ensure_ascii=False, indent=2))
    else:
        print(analysis.to_text(explain=args.explain))
    return 0
