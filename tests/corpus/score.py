#!/usr/bin/env python3
"""Per-field accuracy of the analyzer on a labelled batch, for the History table of README.md.

Run it on a new batch BEFORE any rule is changed for it (the "first sight" figure), then again after:

    .venv/bin/python tests/corpus/score.py tests/corpus/excerpts --first e23.log --last e49.log

An analyzer that places no phase (phase "" or "unknown") scores as `unknown`, the label for an excerpt that
does not itself show where it failed. Every miss is listed, so a doubtful label is argued, not fitted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kernel.analyzer import analyze_path

FIELDS = ("phase", "category", "first_error_line")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("corpus", type=Path, help="a folder with labels.jsonl and logs/")
    parser.add_argument("--first", help="first file of the batch (by name order)")
    parser.add_argument("--last", help="last file of the batch (by name order)")
    args = parser.parse_args()
    labels = [json.loads(line) for line in (args.corpus / "labels.jsonl").read_text(encoding="utf-8").splitlines()]
    batch = [
        label
        for label in labels
        if (args.first is None or label["file"] >= args.first) and (args.last is None or label["file"] <= args.last)
    ]
    misses: dict[str, list[str]] = {field: [] for field in FIELDS}
    for label in batch:
        out = analyze_path(args.corpus / "logs" / label["file"]).to_json()
        have = {
            "phase": (out["phase"] or "unknown") if out["first_error"] else None,
            "category": out["category"],
            "first_error_line": out["first_error"]["line"] if out["first_error"] else None,
        }
        for field in FIELDS:
            if have[field] != label[field]:
                misses[field].append(f"{label['file']}: {have[field]!r} (label {label[field]!r})")
    for field in FIELDS:
        print(f"{field}: {len(batch) - len(misses[field])}/{len(batch)}")
        for miss in misses[field]:
            print(f"  miss {miss[:220]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
