"""Whole-file analysis (runner.analyzer.scan) jumps over lines; its result must be streaming's, exactly:
on every corpus log, on generated logs that mix corpus logs with serving noise and traps, and on lines
built to test the needles' completeness (every rule example, every shape of traceback source line)."""

from __future__ import annotations

import io
import random
import re

import pytest

pytest.importorskip("hyperscan")

from runner.analyzer import Analysis, StreamAnalyzer, analyze_lines, analyze_path, analyze_stream
from runner.analyzer import scan as scan_module
from runner.analyzer.needles import needles
from runner.analyzer.reader import iter_lines
from runner.analyzer.rules import default_rules
from tests.test_analyzer_fuzz import PIECES
from tests.test_analyzer_support import CORPUS, corpus_labels, traceback

RULES = default_rules()
TEXT_PIECES = [piece for piece in PIECES if "\x00" not in piece]  # NUL makes a log binary
LABELS = corpus_labels()
NOISE = [
    "INFO 04-28 16:56:28 metrics.py:351] Avg prompt throughput: 186.0 tokens/s, Avg generation throughput: 31.1 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 0.3%",
    'INFO:     127.0.0.1:49142 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    '(APIServer pid=7) INFO:     127.0.0.1:35594 - "GET /v1/models HTTP/1.1" 200 OK',
    "(APIServer pid=7) INFO 08-01 21:24:19 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Running: 0 reqs",
    "INFO 04-18 14:22:41 logger.py:39] Received request chatcmpl-1: prompt: 'fix this:\\n    raise ValueError(x)\\nTraceback (most recent call last):', params: SamplingParams(n=1)",
    "(EngineCore pid=8) WARNING 08-01 21:24:04 [jit_monitor.py:129] Triton kernel JIT compilation during inference: k",
    '\x1b[1;36m(APIServer pid=4394)\x1b[0;0m INFO:     127.0.0.1:33320 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "INFO 04-28 16:56:08 async_llm_engine.py:208] Added request chat-45cf55a99b8544a6ae4e335a2ed6d622.",
]
# Python source lines of a traceback, as collectors and processes wrap them.
WRAPPERS = [
    "",
    "vllm-1  | ",
    "svc\xa0|\u3000",
    "2025-01-01T00:00:00.123Z ",
    "2025-01-01T00:00:00+02:00\t",
    "[pod/x-1/c] ",
    "2025-01-01T00:00:00.123456789+00:00 stderr F ",
    "Jan  1 00:00:00 gpu-a1 vllm[42]: ",
]
PREFIXES = [
    "",
    "(Worker_TP1 pid=2) ",
    "(APIServer pid=1) (EngineCore_DP0 pid=68)",
    "[rank0]:",
    "\x1b[0;36m(W pid=3)\x1b[0;0m ",
]
CODE = [
    "    x = f(y)",
    "\t\t\t\treturn",
    '  File "/x/y.py", line 3, in f',
    "      ^^^^^^",
    "    ...<7 lines>...",
    "\r    z",
]


def streamed(data: bytes) -> Analysis:
    """The reference: every line fed, as analyze_stream does for a pipe."""
    return analyze_lines(iter_lines(io.BytesIO(data), max_line_chars=RULES.line.max_chars), RULES)


def scanned(data: bytes) -> Analysis:
    stream = io.BytesIO(data)
    assert scan_module.usable(stream, RULES)
    return analyze_stream(stream)


def test_default_rules_have_needles_for_every_pattern() -> None:
    assert RULES.scan is not None
    for rule in RULES.rules:
        found = needles(rule.pattern)
        assert found, rule.id
        for example in rule.examples:
            assert any(n in example for n in found), (rule.id, example)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("Error|Exception", {"Error", "Exception"}),
        ("abc(?:defg|hij)k", {"abcdefg", "abchij"}),
        ("x+ out of memory", {" out of memory"}),
        ("(?i:address already in use)", None),
        ("[Aa]ddress already in use", {"ddress already in use"}),
        ("a|bcdef", None),
        ("(?:CUDA )?error: out", {"error: out"}),
    ],
)
def test_needles_of_patterns(pattern: str, expected: set[str] | None) -> None:
    found = needles(re.compile(pattern))
    assert (set(found) if found is not None else None) == expected


@pytest.mark.parametrize("label", LABELS, ids=[label["file"] for label in LABELS])
def test_corpus_log_scanned_equals_streamed(label: dict[str, object]) -> None:
    data = (CORPUS / "logs" / str(label["file"])).read_bytes()
    assert analyze_path(CORPUS / "logs" / str(label["file"])) == streamed(data)


def _corpus_lines() -> list[list[str]]:
    return [
        (CORPUS / "logs" / str(label["file"])).read_bytes().decode("utf-8", errors="replace").split("\n")
        for label in LABELS
    ]


def _mixed_log(rng: random.Random, logs: list[list[str]]) -> bytes:
    """Serving noise with corpus logs, traps and wrapped source lines interleaved."""
    out: list[str] = []
    for _ in range(rng.randint(1, 12)):
        out += rng.choices(NOISE, k=rng.randint(0, 200))
        kind = rng.random()
        if kind < 0.3 and logs:
            out += rng.choice(logs)
        elif kind < 0.6:
            out += ["".join(rng.choices(TEXT_PIECES, k=rng.randint(1, 3))) for _ in range(rng.randint(1, 8))]
        elif kind < 0.8:
            out.append(rng.choice(WRAPPERS) + rng.choice(PREFIXES) + rng.choice(CODE))
            out += rng.choices(NOISE, k=rng.randint(0, 3))
            out.append(
                rng.choice(
                    ["Note: x", "KeyError: 'k'", "Route: /v1/models", "torch.OutOfMemoryError: CUDA out of memory."]
                )
            )
        else:
            out += traceback(
                rng.choice(PREFIXES), ["load_model", "capture_model"], rng.choice([*PIECES[3:5], "ValueError: x"])
            )
    return ("\n".join(out) + rng.choice(["", "\n", "\r\n"])).encode()


@pytest.mark.parametrize("seed", range(60))
def test_mixed_logs_scanned_equal_streamed(seed: int) -> None:
    rng = random.Random(seed)
    data = _mixed_log(rng, _corpus_lines())
    assert scanned(data) == streamed(data)


@pytest.mark.parametrize("seed", range(10))
def test_random_bytes_scanned_equal_streamed(seed: int) -> None:
    rng = random.Random(seed)
    data = bytes(rng.choice(b"\n\r\t \x1b[]()|:^~AEFINORacdeilnorstuy0123456789\xc2\xa0") for _ in range(20_000))
    assert scanned(data) == streamed(data)


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("code", CODE)
def test_source_lines_open_a_traceback_only_with_a_needle(wrapper: str, prefix: str, code: str) -> None:
    """Outside a traceback, only a frame line (a needle) opens one; other source lines change nothing."""
    line = wrapper + prefix + code
    analyzer = StreamAnalyzer()
    analyzer.feed(NOISE[1])
    analyzer.feed(line)
    assert RULES.scan is not None
    if not any(needle in line for needle in RULES.scan.errors):
        assert analyzer.watch() is not None
    exception = f"{prefix}torch.cuda.CudaOOM: x"  # a bare exception line: no error unless a traceback is open
    data = "\n".join([NOISE[1], line, exception]).encode()
    assert scanned(data) == streamed(data)


def test_context_of_the_error_includes_lines_jumped_over() -> None:
    data = "\n".join([*NOISE[1:2] * 50, "RuntimeError: NCCL error: unhandled system error"]).encode()
    result = scanned(data)
    assert result == streamed(data)
    assert result.first_error is not None and result.first_error.context[:3] == (NOISE[1],) * 3


def test_overlong_lines_and_small_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_module, "CHUNK_BYTES", 1)  # the buffer is then two decoded lines' bytes
    tail = "\n".join(["Traceback (most recent call last):", '  File "x.py", line 1, in load_model', "KeyError: 'w'"])
    data = f"{'x' * 300_000} NCCL error\n{NOISE[1] * 20}\n{'y' * 200_000}\n{tail}".encode()
    assert scanned(data) == streamed(data)
    # The context is read again after an overlong line: its offsets must be right.
    data = "\n".join(["z" * 300_000, *[NOISE[1]] * 50, "RuntimeError: NCCL error: x"]).encode()
    result = scanned(data)
    assert result == streamed(data)
    assert result.first_error is not None and result.first_error.context[0] == NOISE[1]


def test_context_of_an_error_chosen_at_the_end() -> None:
    """A logged error without a traceback is chosen only at close(), long after it was read."""
    errors = [f"ERROR 01-01 00:00:00 [x.py:{i}] something failed {i}" for i in range(6000)]
    hello = "INFO 01-01 00:00:00 [x.py:0] hello"  # the same stream as the first error, jumped over
    data = "\n".join([hello] * 30 + errors).encode()
    result = scanned(data)
    assert result == streamed(data)
    assert result.first_error is not None and result.first_error.line_no == 31
    assert result.first_error.context[:3] == (hello,) * 3


def test_more_streams_than_kept_does_not_change_the_result() -> None:
    noise = [f"(Worker pid={i}) INFO 01-01 00:00:00 [x{i}.py:1] hello" for i in range(2000)]
    lines = ["(W pid=1) Traceback (most recent call last):", *noise[:1000], "(W pid=1) KeyError: 'k'", *noise]
    data = "\n".join(lines).encode()
    assert scanned(data) == streamed(data)


def test_the_scan_reads_few_lines_of_serving_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    fed = []
    original = StreamAnalyzer.feed
    monkeypatch.setattr(
        StreamAnalyzer, "feed", lambda self, line, at=None: fed.append(line) or original(self, line, at)
    )
    startup = (CORPUS / "logs" / "038.log").read_bytes()
    data = startup + ("\n".join(NOISE * 500) + "\n").encode() + b"RuntimeError: NCCL error: x\n"
    result = scanned(data)
    assert result.first_error is not None and result.first_error.category == "nccl_comm"
    assert len(fed) < 0.05 * result.lines


def test_without_hyperscan_every_line_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scan_module, "_HYPERSCAN", False)
    data = _mixed_log(random.Random(1), [])
    assert not scan_module.usable(io.BytesIO(data), RULES)
    assert analyze_stream(io.BytesIO(data)) == streamed(data)


def test_only_a_frame_line_opens_a_traceback() -> None:
    """Indented text outside a traceback (a config dump, a pasted snippet) is not a traceback's source."""
    assert streamed(b"    x = f(y)\nStopIteration\n").first_error is None
    found = streamed(b'  File "x.py", line 1, in load_model\nStopIteration\n').first_error
    assert found is not None and found.line == "StopIteration"
