"""Whole-file analysis (kernel.analyzer.scan) jumps over lines; its result must be streaming's, exactly:
on every corpus log, on generated logs that mix corpus logs with serving noise and traps, and on lines
built to test the needles' completeness (every rule example, every shape of traceback source line)."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("hyperscan")

import hyperscan

from kernel.analyzer import Analysis, StreamAnalyzer, analyze_lines, analyze_path, analyze_stream, disk_cache
from kernel.analyzer import needles as needles_module
from kernel.analyzer import scan as scan_module
from kernel.analyzer.needles import needles, superset_expression
from kernel.analyzer.reader import InputError, iter_lines
from kernel.analyzer.rules import default_rules
from tests.analyzer_logs import FIRST_ERROR, dense_lines
from tests.test_analyzer_fuzz import PIECES
from tests.test_analyzer_support import CORPUS, corpus_labels, traceback

RULES = default_rules()
_HEAD = disk_cache._HEAD_BYTES  # a cache file's magic and digest, before its content
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


def _count_feeds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The lines the analyzer is fed from now on."""
    fed: list[str] = []
    original = StreamAnalyzer.feed

    def feed(self: StreamAnalyzer, line: str, at: float | None = None) -> list[Any]:
        fed.append(line)
        return original(self, line, at)

    monkeypatch.setattr(StreamAnalyzer, "feed", feed)
    return fed


# -- error-dense logs: a logged error line is held, later ones are jumped over (scan._Plan) ------------------------

HEADERS = [
    "ERROR 03-01 12:00:00 [core.py:700] EngineCore failed",
    "ERROR:    something failed in the app",
    "ERROR 03-01 12:00:00 [worker.py:12] failed in load_model",  # names a frame: read even while holding
    "CRITICAL 03-01 12:00:00 [watchdog.py:20] the watchdog fired",
]


def _dense_log(rng: random.Random, logs: list[list[str]]) -> bytes:
    """Error-dense noise with what can still beat a held error line: a logged error line heading a traceback (at
    once or after other processes' lines), bare tracebacks, exception-shaped lines (also at INFO level and
    coloured), corpus logs."""
    out = [FIRST_ERROR] if rng.random() < 0.8 else []
    procs = ["", "(Worker_TP1 pid=2) ", "(EngineCore_DP0 pid=3) "]
    for _ in range(rng.randint(1, 10)):
        out += dense_lines(rng, rng.randint(0, 300))
        kind = rng.random()
        proc = rng.choice(procs)
        if kind < 0.35:
            out.append(proc + rng.choice(HEADERS))
            out += [rng.choice(procs[1:]) + line for line in dense_lines(rng, rng.choice([0, 0, 1, 3]))]
            out += traceback(proc, ["load_model", "execute_model"], rng.choice(["KeyError: 'w'", "ValueError: x"]))
        elif kind < 0.5:
            out += traceback(proc, ["capture_model"], "RuntimeError: boom")
        elif kind < 0.7:
            out.append(
                rng.choice(
                    [
                        f"{proc}INFO 03-01 12:00:00 [retry.py:77] retry after ConnectionResetError: peer closed",
                        f"{proc}ValueError: bad input",
                        f"{proc}\x1b[31mValue\x1b[0mError: coloured",
                        f"{proc}ERROR 03-01 12:00:00 [x.py:1] TimeoutError: upstream",
                    ]
                )
            )
        elif logs:
            out += rng.choice(logs)
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize("seed", range(60))
def test_error_dense_logs_scanned_equal_streamed(seed: int) -> None:
    rng = random.Random(seed)
    data = _dense_log(rng, _corpus_lines() if seed % 4 == 0 else [])
    assert scanned(data) == streamed(data)


@pytest.mark.parametrize("seed", range(12))
def test_error_dense_logs_in_small_buffers(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """A traceback's header in an earlier buffer, or before a line that was read: the scan starts again."""
    monkeypatch.setattr(scan_module, "CHUNK_BYTES", 1)
    data = _dense_log(random.Random(seed), [])
    assert scanned(data) == streamed(data)


def test_a_held_error_line_is_beaten_by_a_later_headed_traceback() -> None:
    """The early ERROR line is held; the later one heads a traceback (other processes' lines between): the
    later one is the first error, read although lines at an error level are jumped over while holding."""
    rng = random.Random(7)
    lines = [
        FIRST_ERROR,
        *dense_lines(rng, 3000),
        "(Worker_TP1 pid=2) ERROR:    loading 'model.layers.0.weight_scale_inv' failed",
        "(Worker_TP0 pid=1) INFO 03-01 12:00:00 [x.py:1] hello",
        *traceback("(Worker_TP1 pid=2) ", ["load_model"], "KeyError: 'model.layers.0.weight_scale_inv'"),
        *dense_lines(rng, 100),
    ]
    data = "\n".join(lines).encode()
    result = scanned(data)
    assert result == streamed(data)
    assert result.first_error is not None and result.first_error.line_no == 3002


def test_a_header_jumped_over_before_a_line_that_was_read_starts_the_scan_again() -> None:
    """The header was jumped over while holding; an exception of another process was read after it, then the
    header's traceback starts: the scan cannot read the header in its place, so it analyzes again."""
    rng = random.Random(8)
    lines = [
        FIRST_ERROR,
        *dense_lines(rng, 2000),
        "(Worker_TP1 pid=2) ERROR:    loading 'model.layers.0.weight_scale_inv' failed",
        "(Worker_TP0 pid=1) ValueError: something else, in another process",
        *traceback("(Worker_TP1 pid=2) ", ["load_model"], "KeyError: 'model.layers.0.weight_scale_inv'"),
        *dense_lines(rng, 100),
    ]
    data = "\n".join(lines).encode()
    result = scanned(data)
    assert result == streamed(data)
    assert result.first_error is not None and result.first_error.line_no == 2002


def test_error_dense_noise_reads_few_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """A third of the lines have error words, none a vLLM error: with an error line held, few are read."""
    fed = _count_feeds(monkeypatch)
    data = ("\n".join([FIRST_ERROR, *dense_lines(random.Random(3), 6000)]) + "\n").encode()
    result = scanned(data)
    assert len(fed) < 0.01 * result.lines
    assert result == streamed(data)
    assert result.first_error is not None and result.first_error.line == FIRST_ERROR


def test_the_exception_shape_is_searched_by_its_pattern() -> None:
    """Before the first error, `Error`/`Exception` alone do not stop the scan: only lines the exception-shape
    pattern may match (a superset of where it matches), whatever rules.toml holds."""
    plan = scan_module._plan(RULES)
    assert plan is not None
    shape = RULES.traceback.standalone
    generic = needles(shape)
    assert generic and not generic & plan.errors
    dbs = scan_module._database(frozenset(), plan.shaped)
    finder = scan_module._Finder()
    for text in [*TEXT_PIECES, *NOISE, *dense_lines(random.Random(5), 300), "ÄValueError: x", "a.b.KeyError(x): y"]:
        buf = bytearray(text.encode() + b"\n")
        finder.reset()
        found = finder.find(dbs, buf, 0, len(buf)) >= 0
        assert found or not shape.search(text), text


@pytest.mark.parametrize(
    ("pattern", "matches", "misses"),
    [
        (r"(?>\w*?Error)\w*+:\s", ["KeyError: x", "ÄError: x"], ["Error x"]),
        (r"^CUDA error: (?:out|illegal)", ["x CUDA error: out"], ["CUDA error:  out"]),
        (r"[^\d\s]{3}\d", ["abc1", "äöü1"], ["ab 1"]),
        (r"a(?=b)", ["ab"], ["xy"]),
    ],
)
def test_superset_expression_matches_wherever_the_pattern_does(
    pattern: str, matches: list[str], misses: list[str]
) -> None:
    expression = superset_expression(re.compile(pattern))
    assert expression is not None
    dbs = scan_module._database(frozenset(), (expression,))
    finder = scan_module._Finder()
    for text in matches + misses:
        buf = bytearray(text.encode() + b"\n")
        finder.reset()
        assert (finder.find(dbs, buf, 0, len(buf)) >= 0) == (text in matches), text


@pytest.mark.parametrize("pattern", [r"(?i)error", r"(a)?(?(1)b|c)", r"x*"])
def test_superset_expression_refuses_what_it_cannot_widen(pattern: str) -> None:
    assert superset_expression(re.compile(pattern)) is None


# -- the pipe path: spooled, then scanned like a file -----------------------------------------------------------


class _Pipe(io.RawIOBase):
    """A stream that cannot seek, read in small pieces: what standard input is."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        piece = self._data.read(min(len(buffer), 4096))
        buffer[: len(piece)] = piece
        return len(piece)


@pytest.mark.parametrize("seed", range(8))
def test_the_pipe_path_equals_streaming(seed: int) -> None:
    rng = random.Random(seed)
    data = _dense_log(rng, _corpus_lines()) if seed % 2 else _mixed_log(rng, _corpus_lines())
    pipe = io.BufferedReader(_Pipe(data))
    assert not pipe.seekable()
    read: list[int] = []
    assert analyze_stream(pipe, progress=lambda done, total: read.append(done)) == streamed(data)
    assert read and read[-1] == len(data)


def test_the_pipe_path_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe takes the scan (few lines read), not the line-by-line path."""
    fed = _count_feeds(monkeypatch)
    data = ("\n".join([FIRST_ERROR, *dense_lines(random.Random(4), 5000)]) + "\n").encode()
    result = analyze_stream(io.BufferedReader(_Pipe(data)))
    assert result.lines == 5001 and len(fed) < 0.05 * result.lines


def test_a_gzip_on_a_pipe_equals_streaming() -> None:
    data = _dense_log(random.Random(11), _corpus_lines())
    assert analyze_stream(io.BufferedReader(_Pipe(gzip.compress(data)))) == streamed(data)


def test_a_pipe_past_the_limit_is_refused() -> None:
    data = ("\n".join(dense_lines(random.Random(1), 2000)) + "\n").encode()
    with pytest.raises(InputError, match="larger than"):
        analyze_stream(io.BufferedReader(_Pipe(data)), max_bytes=len(data) // 2)


# The on-disk cache (kernel.analyzer.disk_cache): a file there steers the scan, so one that is not this user's
# alone, or whose content does not match its digest and key, is not used.


def _forget_databases() -> None:
    for kept in (scan_module._database, scan_module._needle_database, scan_module._compiled):
        kept.cache_clear()


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache folder ($XDG_CACHE_HOME in tmp_path), and no database of this process's kept in memory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    _forget_databases()
    yield tmp_path / "xdg" / "k3repro"
    _forget_databases()


def _failing_log(tmp_path: Path) -> tuple[Path, Analysis]:
    """A log whose first error is deep in serving noise (found only if the scan's databases match), and what
    streaming makes of it."""
    example = next(r.examples[0] for r in RULES.rules if r.kind == "root" and r.category == "oom")
    lines = [*NOISE * 200, example, *NOISE * 20]
    path = tmp_path / "vllm.log"
    path.write_text("\n".join(lines) + "\n")
    streamed = analyze_lines(lines)
    assert streamed.first_error is not None and streamed.first_error.line == example
    return path, streamed


def test_a_tampered_database_is_not_used(tmp_path: Path, own_cache: Path) -> None:
    path, streamed = _failing_log(tmp_path)
    assert analyze_path(path) == streamed
    stored = sorted((own_cache / "hyperscan").glob("*.hsdb"))
    assert stored
    blind = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)  # a database that matches nothing in a log
    blind.compile(expressions=[b"\\x00never\\x01"], ids=[0], flags=[0])
    for file in stored:  # the digest kept, the content swapped: as a writer who cannot sign would leave it
        file.write_bytes(file.read_bytes()[:_HEAD] + hyperscan.dumpb(blind))
    _forget_databases()
    assert analyze_path(path) == streamed
    assert all(not file.read_bytes().endswith(hyperscan.dumpb(blind)) for file in stored)  # compiled and stored again


def test_a_tampered_needle_list_is_not_used(own_cache: Path) -> None:
    pattern = "CUDA out of memory"
    derived = needles_module._Derived()
    assert derived.get(pattern, lambda: ["CUDA out of memory"], sorted) == ["CUDA out of memory"]
    derived.write()
    (stored,) = own_cache.glob("needles-*.json")
    head = stored.read_bytes()[:_HEAD]
    stored.write_bytes(head + json.dumps({pattern: ["never in a log"]}).encode())
    assert needles_module._Derived().get(pattern, lambda: ["CUDA out of memory"], sorted) == ["CUDA out of memory"]


def test_a_fresh_cache_is_this_users_alone(tmp_path: Path, own_cache: Path) -> None:
    path, streamed = _failing_log(tmp_path)
    assert analyze_path(path) == streamed
    folders = [tmp_path / "xdg", own_cache, own_cache / "hyperscan"]
    assert [stat.S_IMODE(f.stat().st_mode) for f in folders] == [0o700] * 3
    files = list((own_cache / "hyperscan").iterdir())
    assert files and {stat.S_IMODE(f.stat().st_mode) for f in files} == {0o600}


def test_a_cache_file_others_could_write_is_ignored(own_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = own_cache / "hyperscan" / "x.hsdb"
    assert disk_cache.store(path, b"key", b"payload")
    assert disk_cache.load(path, b"key") == b"payload"
    assert disk_cache.load(path, b"another key") is None  # stored for other patterns
    path.chmod(0o620)
    assert disk_cache.load(path, b"key") is None
    path.chmod(0o600)
    own_cache.chmod(0o770)
    assert disk_cache.load(path, b"key") is None
    assert disk_cache.store(path, b"key", b"payload")  # this user's own folder is closed to others first
    assert stat.S_IMODE(own_cache.stat().st_mode) == 0o700
    with monkeypatch.context() as as_another_user:
        as_another_user.setattr(os, "geteuid", lambda: os.getuid() + 1)
        assert disk_cache.load(path, b"key") is None
        own_cache.chmod(0o770)
        assert not disk_cache.store(path, b"key", b"other")  # another user's folder is neither read nor written
        assert stat.S_IMODE(own_cache.stat().st_mode) == 0o770
    own_cache.chmod(0o700)
    assert disk_cache.load(path, b"key") == b"payload"
    path.write_bytes(path.read_bytes()[:-1])  # damaged
    assert disk_cache.load(path, b"key") is None
