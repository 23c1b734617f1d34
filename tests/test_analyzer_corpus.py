"""The analyzer against the labelled corpus of real vLLM logs (tests/corpus, labels.jsonl).

Labels: phase, first_error_line (the whole line; for a line that starts with ANSI colour codes, the
text after the last colour code), category and secondary_oom; healthy logs have none.

Accuracy is measured per field over the whole corpus against a floor, and every miss is listed, so a
doubtful label is argued in a note rather than fitted by a rule. The floors only ever go up.
"""

from __future__ import annotations

import filecmp
from typing import Any

import pytest

from runner.analyzer import Analysis, analyze_path
from tests.test_analyzer_support import CORPUS, SHARED_CORPUS, corpus_labels

LABELS = corpus_labels()
FIELDS = ("phase", "first_error_line", "category", "secondary_oom", "healthy")
# Per-field floors (share of the corpus right): the figures reached on the 64 logs, raised as the rules improve
# (issue 15 aimed at 0.95 on phase, first-error line and category, every secondary OOM and every healthy log;
# its rules reach every field on all 64, by classes of vLLM behaviour, none fitted to one file).
FLOORS = {"phase": 1.0, "first_error_line": 1.0, "category": 1.0, "secondary_oom": 1.0, "healthy": 1.0}

_cache: dict[str, Analysis] = {}


def analysis(name: str) -> Analysis:
    if name not in _cache:
        _cache[name] = analyze_path(CORPUS / "logs" / name)
    return _cache[name]


def got(label: dict[str, Any]) -> dict[str, Any]:
    result = analysis(label["file"])
    out = result.to_json()
    return {
        "phase": out["phase"],
        "first_error_line": out["first_error"]["line"] if out["first_error"] else None,
        "category": out["category"],
        "secondary_oom": out["secondary_oom"],
        "healthy": result.healthy and result.first_error is None,
    }


def expected(label: dict[str, Any]) -> dict[str, Any]:
    return {**{field: label[field] for field in FIELDS if field != "healthy"}, "healthy": label["phase"] is None}


def test_corpus_accuracy_per_field() -> None:
    misses: dict[str, list[str]] = {field: [] for field in FIELDS}
    for label in LABELS:
        want, have = expected(label), got(label)
        for field in FIELDS:
            if have[field] != want[field]:
                misses[field].append(f"{label['file']}: {have[field]!r} (label {want[field]!r})")
    rates = {field: 1 - len(misses[field]) / len(LABELS) for field in FIELDS}
    report = [f"corpus accuracy over {len(LABELS)} logs:"]
    for field in FIELDS:
        report.append(f"  {field}: {len(LABELS) - len(misses[field])}/{len(LABELS)} ({rates[field]:.1%})")
        report += [f"    miss {miss}" for miss in misses[field]]
    print("\n".join(report))
    below = [f"{field} {rates[field]:.1%} < {FLOORS[field]:.0%}" for field in FIELDS if rates[field] < FLOORS[field]]
    assert not below, "\n".join([*below, *report])


def test_every_secondary_oom_is_found() -> None:
    secondary = [label for label in LABELS if label["secondary_oom"]]
    assert secondary
    assert [label["file"] for label in secondary if not got(label)["secondary_oom"]] == []


@pytest.mark.skipif(not SHARED_CORPUS.is_dir(), reason="outside the workplace: no ../shared/corpus to compare with")
def test_the_corpus_copy_is_in_step_with_shared() -> None:
    names = ["labels.jsonl", *(f"logs/{p.name}" for p in sorted((SHARED_CORPUS / "logs").iterdir()))]
    stale = [name for name in names if not filecmp.cmp(SHARED_CORPUS / name, CORPUS / name, shallow=False)]
    assert stale == [], f"tests/corpus differs from ../shared/corpus: {stale}"
