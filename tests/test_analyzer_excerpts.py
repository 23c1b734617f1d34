"""The analyzer against excerpts engineers paste (tests/corpus/excerpts: issue 27's batches, labelled by
tests/corpus/README.md's rules): logs that start mid-run without start-up markers, tracebacks cut before their
exception line, NCCL watchdogs and warnings, symmetric-memory, NIXL and ZMQ failures, JIT builds. Accuracy per
field and per batch against floors (the figures reached, see the corpus README's history); every miss is listed.
A phase the excerpt does not show is labelled `unknown`, and the analyzer must say so rather than guess."""

from __future__ import annotations

import json

import pytest

from kernel.analyzer import analyze_path, analyze_text
from kernel.analyzer.messages import first_error_message
from protos.vocab import PHASES, UNKNOWN_PHASE
from runner.stages.context import Attempt
from runner.stages.minimize import START_PHASES
from runner.stages.proxies import proxies
from tests.test_analyzer_support import CORPUS

EXCERPTS = CORPUS / "excerpts"
LABELS = [json.loads(line) for line in (EXCERPTS / "labels.jsonl").read_text(encoding="utf-8").splitlines() if line]
# (first file, last file): floors per field. Batch 1, 22 logs: first sight 6/7/12 (phase/category/line), after
# the rules 21/22/22. Batch 2, 27 logs: first sight 13/19/21, after the rules 25/27/26. Batch 3, 20 logs: first
# sight 19/16/19, after the rules 20/20/20. Batch 4, 20 logs: first sight 18/18/18, after the rules 20/20/20. Batch 5
# (f01-f20), 20 logs: first sight 14/13/17, after the rules 19/19/17. Batch 6 (g01-g20), 20 logs: first sight
# 15/13/17, after the rules 19/18/19. Batch 7 (h01-h23), 23 logs: first sight 17/19/21, after the rules 22/23/23
# (the batch-7 rules also raised batch 2 to 26/27/26, batch 5 to 20/20/18 and batch 6 to 20/19/20). Batch 8
# (i01-i22), 22 logs: first sight 17/17/20, after the label review 18/18/20, after the rules 22/22/22.
BATCHES = {
    ("e01.log", "e22.log"): {"phase": 22, "category": 22, "first_error_line": 22},
    ("e23.log", "e49.log"): {"phase": 27, "category": 27, "first_error_line": 26},
    ("e50.log", "e69.log"): {"phase": 20, "category": 20, "first_error_line": 20},
    ("e70.log", "e89.log"): {"phase": 20, "category": 20, "first_error_line": 20},
    ("f01.log", "f20.log"): {"phase": 20, "category": 20, "first_error_line": 19},
    ("g01.log", "g20.log"): {"phase": 20, "category": 20, "first_error_line": 20},
    ("h01.log", "h23.log"): {"phase": 22, "category": 23, "first_error_line": 23},
    ("i01.log", "i22.log"): {"phase": 22, "category": 22, "first_error_line": 22},
    ("j01.log", "j22.log"): {"phase": 20, "category": 21, "first_error_line": 20},
    ("k01.log", "k22.log"): {"phase": 22, "category": 22, "first_error_line": 22},
    ("l01.log", "l22.log"): {"phase": 22, "category": 21, "first_error_line": 22},
    ("m01.log", "m22.log"): {"phase": 22, "category": 22, "first_error_line": 22},
    ("n01.log", "n22.log"): {"phase": 21, "category": 22, "first_error_line": 22},
    ("o01.log", "o22.log"): {"phase": 20, "category": 20, "first_error_line": 22},
}


@pytest.mark.parametrize("batch", sorted(BATCHES), ids=[f"{a}-{b}" for a, b in sorted(BATCHES)])
def test_excerpt_accuracy_per_field(batch: tuple[str, str]) -> None:
    floors = BATCHES[batch]
    labels = [label for label in LABELS if batch[0] <= label["file"] <= batch[1]]
    misses: dict[str, list[str]] = {field: [] for field in floors}
    for label in labels:
        out = analyze_path(EXCERPTS / "logs" / label["file"]).to_json()
        have = {
            "phase": out["phase"],
            "category": out["category"],
            "first_error_line": out["first_error"]["line"] if out["first_error"] else None,
        }
        for field in floors:
            if have[field] != label[field]:
                misses[field].append(f"{label['file']}: {have[field]!r} (label {label[field]!r})")
    report = [f"{field}: {len(labels) - len(m)}/{len(labels)} {m}" for field, m in misses.items()]
    print("\n".join(report))
    assert all(len(labels) - len(misses[f]) >= floors[f] for f in floors), "\n".join(report)


def test_every_excerpt_is_in_a_batch() -> None:
    assert sorted(label["file"] for label in LABELS) == sorted(
        label["file"] for label in LABELS if any(a <= label["file"] <= b for a, b in BATCHES)
    )


def test_a_cut_traceback_is_named_with_low_confidence() -> None:
    out = analyze_path(EXCERPTS / "logs" / "e18.log").to_json(explain=True)
    assert (out["phase"], out["phase_from"], out["category"], out["confidence"]) == (
        "request",
        "frames",
        "request_error",
        "low",
    )


def test_a_cut_traceback_headed_by_a_wrapper_line_is_named_by_that_line() -> None:
    # `EngineCore failed to start.` then a traceback the excerpt cuts in _initialize_kv_caches.
    error = analyze_path(EXCERPTS / "logs" / "e24.log").first_error
    assert error is not None and not error.confident
    assert (error.line_no, error.phase, error.phase_from) == (1, "engine_init", "frames")


def test_collective_sequence_numbers_place_a_watchdog_timeout() -> None:
    serving = analyze_path(EXCERPTS / "logs" / "e13.log").first_error
    startup = analyze_path(EXCERPTS / "logs" / "e14.log").first_error
    assert serving is not None and (serving.phase, serving.phase_from) == ("request", "collective_seq")
    assert startup is not None and (startup.phase, startup.phase_from) == ("gpu_detect", "collective_seq")


def test_out_of_memory_text_wins_whatever_raised_it() -> None:
    error = analyze_text("RuntimeError: Triton Error [CUDA]: out of memory\n").first_error
    assert error is not None and error.category == "oom"


def test_nccl_warn_lines_are_the_error_only_when_no_exception_follows() -> None:
    warnings_only = analyze_path(EXCERPTS / "logs" / "e10.log").first_error
    assert warnings_only is not None
    assert (warnings_only.line_no, warnings_only.category, warnings_only.phase) == (1, "nccl_comm", "gpu_detect")
    assert "NCCL WARN" in warnings_only.line
    followed = analyze_path(EXCERPTS / "logs" / "e09.log").first_error
    assert followed is not None and followed.line.startswith("RuntimeError: NCCL error: invalid usage")
    plugin = analyze_text("node:1:1 [0] NCCL WARN NET/Plugin: Could not find: libnccl-net.so\n")
    assert plugin.first_error is None  # NCCL's optional plugins are not there: harmless


def test_an_excerpt_that_does_not_show_its_phase_is_unknown_not_guessed() -> None:
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has 21.75 MiB free."
    alone = analyze_text(oom).to_json(explain=True)
    assert (alone["phase"], alone["phase_from"], alone["category"]) == (UNKNOWN_PHASE, "unknown", "oom")
    assert "phase: unknown (from unknown)" in "\n".join(alone["explain"])
    # The API server's output handler failing right after it says the engine was serving.
    served = analyze_text(
        "\n".join(
            [
                f"(EngineCore pid=112) ERROR 05-01 14:39:06 [core.py:1131] {oom}",
                "(APIServer pid=1) ERROR 05-01 14:39:06 [async_llm.py:699] AsyncLLM output_handler failed.",
            ]
        )
    ).first_error
    assert served is not None and (served.phase, served.phase_from, served.line_no) == ("request", "wrapper_after", 1)


def test_a_worker_method_or_a_start_up_wrapper_places_what_it_reports() -> None:
    fault = "(Worker_PP0 pid=7) ERROR 07-15 21:01:01 [multiproc_executor.py:1007] torch.AcceleratorError: CUDA error: an illegal memory access was encountered"
    alone = analyze_text(fault).first_error
    assert alone is not None and alone.phase == UNKNOWN_PHASE
    starting = analyze_text(
        fault + "\n(EngineCore pid=3) ERROR 07-15 21:01:01 [core.py:1240] EngineCore failed to start."
    )
    assert starting.first_error is not None
    # A kernel ran while the engine started: engine_init, and a kernel fault, not a driver initialisation failure.
    assert (starting.first_error.phase, starting.first_error.phase_from) == ("engine_init", "rule_in_startup")
    assert starting.first_error.category == "other"
    nccl = "RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)"
    ray = "(RayWorkerWrapper pid=2) ERROR 08-27 05:12:18 worker_base.py:382] Error executing method init_device. This might cause deadlock in distributed execution."
    placed = analyze_text(f"{nccl}\n{ray}").first_error
    assert placed is not None and (placed.phase, placed.category) == ("gpu_detect", "nccl_comm")


def test_the_method_decides_nothing_from_an_unknown_phase() -> None:
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has 21.75 MiB free."
    pasted = analyze_text(line).first_error
    launched = analyze_text(
        "\n".join(
            [
                "(APIServer pid=1) INFO:     Application startup complete.",
                f"(EngineCore pid=112) ERROR 05-01 14:39:06 [core.py:1131] {line}",
            ]
        )
    ).first_error
    other = analyze_text("RuntimeError: NCCL error: unhandled system error").first_error
    assert pasted is not None and launched is not None and other is not None
    assert (pasted.phase, launched.phase) == (UNKNOWN_PHASE, "request")
    wanted = first_error_message(pasted)
    # The same error the run met, wherever it placed it: the same failure; another error is not.
    assert Attempt(launched.phase, launched.category, launched.signature).same_as(wanted)
    assert not Attempt(other.phase, other.category, other.signature).same_as(wanted)
    # Two placed failures still differ by their phase.
    placed = Attempt("engine_init", launched.category, launched.signature.replace("request:", "engine_init:", 1))
    assert not placed.same_as(first_error_message(launched))
    # No proxy is trusted to show an unplaced failure, and minimize probes rather than trusting a start-up phase.
    unknown = Attempt(UNKNOWN_PHASE, pasted.category, pasted.signature)
    assert not any(proxy.preserves(unknown) for proxy in proxies())
    assert UNKNOWN_PHASE not in START_PHASES and UNKNOWN_PHASE not in PHASES
