"""The analyzer against the labelled corpus of real vLLM logs (../shared/corpus, labels.jsonl).

Labels: phase, first_error_line (the whole line; for a line that starts with ANSI colour codes, the
text after the last colour code), category and secondary_oom; healthy logs have none.
"""

from __future__ import annotations

from typing import Any

import pytest

from runner.analyzer import Analysis, analyze_path
from tests.test_analyzer_support import CORPUS, corpus_labels

LABELS = corpus_labels()
pytestmark = pytest.mark.skipif(not LABELS, reason=f"no labelled corpus at {CORPUS}")
# Accuracy floors of issue 3 (per field, over the whole corpus).
FLOORS = {"phase": 0.90, "first_error_line": 0.85, "category": 0.85}

_cache: dict[str, Analysis] = {}


def analysis(name: str) -> Analysis:
    if name not in _cache:
        _cache[name] = analyze_path(CORPUS / "logs" / name)
    return _cache[name]


def got(label: dict[str, Any]) -> dict[str, Any]:
    out = analysis(label["file"]).to_json()
    return {
        "phase": out["phase"],
        "first_error_line": out["first_error"]["line"] if out["first_error"] else None,
        "category": out["category"],
        "secondary_oom": out["secondary_oom"],
    }


@pytest.mark.parametrize("label", LABELS, ids=[label["file"] for label in LABELS])
def test_corpus_log(label: dict[str, Any]) -> None:
    result = got(label)
    expected = {k: label[k] for k in result}
    assert result == expected, label["notes"]
    healthy = label["phase"] is None
    assert analysis(label["file"]).healthy == healthy
    if healthy:
        assert analysis(label["file"]).first_error is None


def test_corpus_accuracy_floors(capsys: pytest.CaptureFixture[str]) -> None:
    fields = ["phase", "first_error_line", "category", "secondary_oom"]
    hits = dict.fromkeys(fields, 0)
    for label in LABELS:
        result = got(label)
        for field in fields:
            hits[field] += result[field] == label[field]
    rates = {field: hits[field] / len(LABELS) for field in fields}
    with capsys.disabled():
        print(
            "\ncorpus accuracy over",
            len(LABELS),
            "logs:",
            ", ".join(f"{f} {hits[f]}/{len(LABELS)} ({rates[f]:.0%})" for f in fields),
        )
    for field, floor in FLOORS.items():
        assert rates[field] >= floor, f"{field} accuracy {rates[field]:.0%} below {floor:.0%}"
