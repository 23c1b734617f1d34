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

from kernel.analyzer import Analysis, analyze_path, analyze_text
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


# How an engineer gets a log off a cluster: through a collector that prefixes every line (the line number is
# each line's, so timestamps differ from line to line as a collector's would).
COLLECTORS = {
    "docker compose": lambda n, line: f"vllm-1  | {line}",
    "docker logs -t": lambda n, line: f"2026-12-04T10:{n // 60 % 60:02d}:{n % 60:02d}.123456789Z {line}",
    "kubectl --prefix": lambda n, line: f"[pod/vllm-0/vllm] {line}",
    "a node's CRI log file": lambda n, line: f"2026-12-04T10:00:{n % 60:02d}.12345+00:00 stdout F {line}",
    "journalctl": lambda n, line: f"Dec  4 10:{n // 60 % 60:02d}:{n % 60:02d} gpu-a1 vllm[4242]: {line}",
    "journalctl -o short-iso": lambda n, line: f"2026-12-04T10:00:{n % 60:02d}+0000 gpu-a1 vllm[4242]: {line}",
}


@pytest.mark.parametrize("collector", sorted(COLLECTORS))
def test_a_log_read_through_a_collector_reads_the_same(collector: str) -> None:
    wrap = COLLECTORS[collector]
    misses = []
    for label in LABELS:
        text = (CORPUS / "logs" / label["file"]).read_bytes().decode("utf-8", "replace")  # CRs kept, as in the file
        wrapped = analyze_text("\n".join(wrap(n, line) for n, line in enumerate(text.split("\n"))))
        plain, error = analysis(label["file"]).first_error, wrapped.first_error
        same = (plain is None) == (error is None) and (
            plain is None
            or error is None
            or (plain.phase, plain.category, plain.secondary_oom, plain.line_no)
            == (error.phase, error.category, error.secondary_oom, error.line_no)
        )
        if not same:
            misses.append(f"{label['file']}: {error and (error.phase, error.category, error.line_no)}")
    assert not misses, f"{collector}: {len(misses)} of {len(LABELS)} logs read otherwise: {misses}"


def test_every_secondary_oom_is_found() -> None:
    secondary = [label for label in LABELS if label["secondary_oom"]]
    assert secondary
    assert [label["file"] for label in secondary if not got(label)["secondary_oom"]] == []


@pytest.mark.skipif(not SHARED_CORPUS.is_dir(), reason="outside the workplace: no ../shared/corpus to compare with")
def test_the_corpus_copy_is_in_step_with_shared() -> None:
    names = ["labels.jsonl", *(f"logs/{p.name}" for p in sorted((SHARED_CORPUS / "logs").iterdir()))]
    stale = [name for name in names if not filecmp.cmp(SHARED_CORPUS / name, CORPUS / name, shallow=False)]
    assert stale == [], f"tests/corpus differs from ../shared/corpus: {stale}"
