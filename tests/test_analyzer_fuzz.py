"""Hostile input never crashes the analyzer and always yields the JSON contract: random bytes, huge lines,
invalid UTF-8, truncated tracebacks. Seeded, so failures reproduce (property tests with hypothesis are in
test_analyzer_properties.py)."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest

from kernel.analyzer import Analysis, InputError, StreamAnalyzer, analyze_stream, analyze_text, default_rules
from protos.vocab import CATEGORIES, PHASES, UNKNOWN_PHASE
from tests.test_analyzer_support import CORPUS, traceback

PIECES = [
    "Traceback (most recent call last):",
    '  File "/x/vllm/worker.py", line 1, in init_device',
    "    raise RuntimeError(f'NCCL error: {e}')",
    "RuntimeError: NCCL error: unhandled system error",
    "torch.OutOfMemoryError: CUDA out of memory.",
    "ERROR 01-01 00:00:00 [core.py:1] EngineCore failed to start.",
    "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] ",
    "(APIServer pid=1) (Worker_TP1 pid=2) ",
    "(Worker_TP1 pid=2) ",
    "(Worker_TP2 pid=3) ERROR 01-01 00:00:00 [x.py:1] ",
    "(Worker_TP2 pid=3) INFO 01-01 00:00:00 [x.py:1] ",
    "Error in preprocessing prompt inputs",
    "    ...<7 lines>...",
    "KeyError: 'k'",
    "INFO:     Application startup complete.",
    "INFO 01-01 00:00:00 [x.py:1] vLLM API server version 0.9.1",
    "The above exception was the direct cause of the following exception:",
    "\rCapturing CUDA graphs:  50%|#",
    "\x1b[0;36m",
    "[repeated 3x across cluster]",
    "vllm-1  | ",
    "    ^^^^^^^",
    "",
    "ValueError: x",
    "\ufffd\x00\x7f",
]


def check_contract(result: Analysis, source: str | None = None) -> None:
    out: dict[str, Any] = result.to_json()
    assert list(out) == [
        "phase",
        "first_error",
        "category",
        "secondary_oom",
        "hint",
        "phases_seen",
        "signature",
        "phase_from",
        "confidence",
    ]
    assert out["phase"] is None or out["phase"] in [*PHASES, UNKNOWN_PHASE]
    assert (out["phase"] == UNKNOWN_PHASE) == (out["phase_from"] == "unknown")
    assert out["category"] is None or out["category"] in CATEGORIES
    assert isinstance(out["secondary_oom"], bool) and isinstance(out["signature"], str)
    assert all(phase in PHASES for phase in out["phases_seen"])
    if out["first_error"] is None:
        assert out["phase"] is None and out["category"] is None and out["hint"] is None
    else:
        assert out["phase"] and out["category"] and isinstance(out["hint"], str)
        assert out["first_error"]["lineno"] >= 1
        if source is not None:
            assert out["first_error"]["line"] in source


@pytest.mark.parametrize("seed", range(40))
def test_random_mixtures_of_log_pieces(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(25):
        text = "\n".join("".join(rng.choices(PIECES, k=rng.randint(1, 3))) for _ in range(rng.randint(1, 120)))
        check_contract(analyze_text(text), text)


@pytest.mark.parametrize("seed", range(10))
def test_random_bytes(seed: int) -> None:
    rng = random.Random(seed)
    data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 20_000)))
    try:
        result = analyze_stream(io.BytesIO(data))
    except InputError:
        return
    check_contract(result)


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    data = b"INFO 01-01 00:00:00 [x.py:1] Starting to load model \xff\xfe...\nRuntimeError: NCCL error: \xc3\x28\n"
    result = analyze_stream(io.BytesIO(data))
    assert result.first_error is not None
    assert result.first_error.line == "RuntimeError: NCCL error: \ufffd("


def test_huge_lines_are_cut_and_memory_stays_bounded() -> None:
    cap = default_rules().line.max_chars
    huge = "x" * (5 * cap) + " RuntimeError: NCCL error: late in a huge line"
    data = f"{huge}\n{'y' * (3 << 20)}\nOSError: [Errno 98] Address already in use\n".encode()
    result = analyze_stream(io.BytesIO(data))
    assert result.lines == 3
    assert result.first_error is not None and result.first_error.line_no == 3
    analyzer = StreamAnalyzer()
    analyzer.feed("z" * (10 * cap))
    assert analyzer.lines == 1


def test_a_line_without_newline_at_the_end_counts() -> None:
    result = analyze_stream(
        io.BytesIO(b"INFO:     Application startup complete.\nOSError: [Errno 98] Address already in use")
    )
    assert result.first_error is not None and result.first_error.line_no == 2


def test_truncated_tracebacks() -> None:
    tb = traceback(
        "(Worker_TP0 pid=7) ERROR 01-01 00:00:00 [multiproc_executor.py:1] ",
        ["worker_main", "load_model"],
        "KeyError: 'w'",
    )
    for cut in range(len(tb) + 1):
        for tail in ([], ["(Worker_TP0 pid=7) INFO 01-01 00:00:01 [x.py:1] after"]):
            text = "\n".join(tb[:cut] + tail)
            check_contract(analyze_text(text), text)


@pytest.mark.parametrize("name", ["006.log", "016.log", "020.log", "030.log"])
def test_corpus_logs_cut_anywhere(name: str) -> None:
    data = (CORPUS / "logs" / name).read_bytes()
    for cut in range(0, len(data), max(1, len(data) // 97)):
        check_contract(analyze_stream(io.BytesIO(data[:cut])))
