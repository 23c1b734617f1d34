"""The analyzer against excerpts engineers paste (tests/corpus/excerpts: issue 27's batch, labelled by
tests/corpus/README.md's rules): logs that start mid-run without start-up markers, tracebacks cut before their
exception line, NCCL watchdogs, symmetric-memory, NIXL and ZMQ failures. Accuracy per field against floors (the
figures reached, see the corpus README's history); every miss is listed."""

from __future__ import annotations

import json

from runner.analyzer import analyze_path
from tests.test_analyzer_support import CORPUS

EXCERPTS = CORPUS / "excerpts"
LABELS = [json.loads(line) for line in (EXCERPTS / "labels.jsonl").read_text(encoding="utf-8").splitlines() if line]
# 22 logs: first sight 6/7/12 (phase/category/line); after the rules 20/18/18.
FLOORS = {"phase": 20, "category": 18, "first_error_line": 18}


def test_excerpt_accuracy_per_field() -> None:
    misses: dict[str, list[str]] = {field: [] for field in FLOORS}
    for label in LABELS:
        out = analyze_path(EXCERPTS / "logs" / label["file"]).to_json()
        have = {
            "phase": out["phase"],
            "category": out["category"],
            "first_error_line": out["first_error"]["line"] if out["first_error"] else None,
        }
        for field in FLOORS:
            if have[field] != label[field]:
                misses[field].append(f"{label['file']}: {have[field]!r} (label {label[field]!r})")
    report = [f"{field}: {len(LABELS) - len(m)}/{len(LABELS)} {m}" for field, m in misses.items()]
    print("\n".join(report))
    assert all(len(LABELS) - len(misses[f]) >= FLOORS[f] for f in FLOORS), "\n".join(report)


def test_a_cut_traceback_is_named_with_low_confidence() -> None:
    out = analyze_path(EXCERPTS / "logs" / "e18.log").to_json(explain=True)
    assert (out["phase"], out["phase_from"], out["category"], out["confidence"]) == (
        "request",
        "frames",
        "request_error",
        "low",
    )


def test_collective_sequence_numbers_place_a_watchdog_timeout() -> None:
    serving = analyze_path(EXCERPTS / "logs" / "e13.log").first_error
    startup = analyze_path(EXCERPTS / "logs" / "e14.log").first_error
    assert serving is not None and (serving.phase, serving.phase_from) == ("request", "collective_seq")
    assert startup is not None and (startup.phase, startup.phase_from) == ("gpu_detect", "collective_seq")


def test_out_of_memory_text_wins_whatever_raised_it() -> None:
    from runner.analyzer import analyze_text

    error = analyze_text("RuntimeError: Triton Error [CUDA]: out of memory\n").first_error
    assert error is not None and error.category == "oom"
