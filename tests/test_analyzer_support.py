"""Shared by the analyzer tests (no tests here): where the labelled corpus is, and feeding helpers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kernel.analyzer import ErrorFinding, PhaseFinding, StreamAnalyzer

REPO = Path(__file__).resolve().parents[1]
# The corpus travels with the repository (tests/corpus, kept in step with the workplace's ../shared/corpus),
# so a clone anywhere runs every corpus test; K3REPRO_CORPUS points the tests at another labelled set.
CORPUS = Path(os.environ.get("K3REPRO_CORPUS", REPO / "tests" / "corpus"))
SHARED_CORPUS = REPO.parent / "shared" / "corpus"


def corpus_labels() -> list[dict[str, Any]]:
    path = CORPUS / "labels.jsonl"
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def feed_all(lines: list[str], analyzer: StreamAnalyzer | None = None) -> tuple[StreamAnalyzer, list[tuple[int, Any]]]:
    """Feed lines one by one; returns the analyzer and (index of the line that produced it, finding)."""
    analyzer = analyzer or StreamAnalyzer()
    found: list[tuple[int, PhaseFinding | ErrorFinding]] = []
    for i, line in enumerate(lines):
        found += [(i, f) for f in analyzer.feed(line, at=float(i))]
    found += [(len(lines), f) for f in analyzer.close()]
    return analyzer, found


def traceback(prefix: str, frames: list[str], exception: str) -> list[str]:
    """A Python traceback as one process prints it, each line behind `prefix`."""
    lines = [f"{prefix}Traceback (most recent call last):"]
    for i, frame in enumerate(frames):
        lines += [f'{prefix}  File "/usr/local/lib/python3.12/dist-packages/vllm/mod{i}.py", line {10 + i}, in {frame}']
        lines += [f"{prefix}    {frame}()"]
    return [*lines, f"{prefix}{exception}"]
