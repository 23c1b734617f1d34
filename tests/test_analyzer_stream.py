"""The streaming contract: findings as soon as they are certain, stream = file, stalls, signatures."""

from __future__ import annotations

from typing import Any

import pytest

from kernel.analyzer import ErrorFinding, PhaseFinding, Stall, StreamAnalyzer, analyze_path, analyze_text, default_rules
from tests.test_analyzer_support import CORPUS, corpus_labels, feed_all, traceback

LABELS = corpus_labels()
FAILING = [label for label in LABELS if label["phase"] is not None]


def corpus_lines(name: str) -> list[str]:
    text = (CORPUS / "logs" / name).read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


def error_findings(found: list[tuple[int, Any]]) -> list[tuple[int, ErrorFinding]]:
    return [(i, f) for i, f in found if isinstance(f, ErrorFinding)]


@pytest.mark.parametrize("label", LABELS, ids=[label["file"] for label in LABELS])
def test_stream_gives_the_file_result(label: dict[str, Any]) -> None:
    analyzer, found = feed_all([f"{line}\n" for line in corpus_lines(label["file"])])
    whole = analyze_path(CORPUS / "logs" / label["file"])
    errors = error_findings(found)
    assert len(errors) <= 1
    assert analyzer.first_error == whole.first_error
    assert analyzer.phases_seen == whole.phases_seen
    assert analyzer.healthy == whole.healthy
    phases = [f.phase for _, f in found if isinstance(f, PhaseFinding)]
    assert set(phases) <= set(whole.phases_seen)


@pytest.mark.parametrize("label", FAILING, ids=[label["file"] for label in FAILING])
def test_first_error_comes_before_close_once_its_traceback_ended(label: dict[str, Any]) -> None:
    lines = corpus_lines(label["file"])
    _, found = feed_all(lines)
    (at, finding) = error_findings(found)[0]
    wait = default_rules().traceback.max_wait_lines
    if len(lines) - finding.line_no > wait:
        assert at < len(lines), "reported only at close()"
        assert at + 1 - finding.line_no <= wait


def test_rule_matched_error_is_reported_on_its_own_line() -> None:
    lines = [
        "(EngineCore pid=6890) INFO 08-03 21:48:40 [gpu_worker.py:298] Available KV cache memory: 8.72 GiB",
        *traceback(
            "(EngineCore pid=6890) ERROR 08-03 21:49:23 [core.py:1231] ",
            ["run_engine_core", "_initialize_kv_caches"],
            "ValueError: No available memory for the cache blocks.",
        ),
        "(EngineCore pid=6890) Process EngineCore:",
    ]
    analyzer = StreamAnalyzer()
    for i, line in enumerate(lines):
        found = analyzer.feed(line, at=float(i))
        if i == len(lines) - 2:
            assert [type(f) for f in found] == [ErrorFinding]
            assert found[0].line == lines[-2]
            assert found[0].context[-1] == lines[-2]
            assert found[0].context[-2].strip().endswith("_initialize_kv_caches()")
    assert analyzer.close() == []


def test_generic_exception_waits_only_for_its_message_to_end() -> None:
    exc = "openai_harmony.HarmonyError: invalid tiktoken vocab file"
    tb = [*traceback("(APIServer pid=21) ", ["init_app_state"], exc), "(APIServer pid=21)   more detail"]
    ends = "(APIServer pid=21) INFO 02-09 12:47:09 [launcher.py:1] Shutting down"
    _, found = feed_all([*tb, "unrelated", ends, "more"])
    [(at, finding)] = error_findings(found)
    assert at == len(tb) + 1  # the process's next record ended the message
    assert finding.line == tb[-2]
    assert finding.context[-1] == tb[-1]
    assert (finding.phase, finding.category) == ("api_listen", "other")


def test_generic_exception_is_certain_after_a_bounded_number_of_lines() -> None:
    tb = traceback("(APIServer pid=21) ", ["init_app_state"], "KeyError: 'vocab'")
    wait = default_rules().traceback.max_wait_lines
    _, found = feed_all([*tb, *(f"(Worker pid={i}) noise {i}" for i in range(2 * wait))])
    [(at, finding)] = error_findings(found)
    assert finding.line == tb[-1]
    assert at - (len(tb) - 1) == wait + 1


def test_phase_findings_come_on_the_marker_line() -> None:
    analyzer = StreamAnalyzer()
    assert analyzer.phase is None
    found = analyzer.feed("INFO 05-12 02:46:33 [gpu_model_runner.py:1] Starting to load model m...")
    assert found == [
        PhaseFinding("weight_load", "INFO 05-12 02:46:33 [gpu_model_runner.py:1] Starting to load model m...", 1)
    ]
    assert analyzer.phase == "weight_load"
    assert analyzer.feed("INFO 05-12 02:46:34 [gpu_model_runner.py:1] Starting to load model m...") == []
    assert analyzer.feed("INFO:     Application startup complete.")[0].phase == "api_listen"
    assert analyzer.healthy


def test_stall_is_reported_with_phase_and_last_line() -> None:
    analyzer = StreamAnalyzer(started_at=0.0)
    assert analyzer.stalled(now=5.0, threshold_s=10.0) is None
    assert analyzer.stalled(now=11.0, threshold_s=10.0) == Stall(None, 11.0, "")
    analyzer.feed("INFO 05-12 02:46:33 [gpu_model_runner.py:1] Starting to load model m...", at=20.0)
    idle = "(EngineCore_DP0 pid=68) INFO 05-12 02:47:33 [shm_broadcast.py:681] No available shared memory broadcast block found in 60 seconds."
    analyzer.feed(idle, at=80.0)  # vLLM's waiting message is not progress
    stall = analyzer.stalled(now=140.0, threshold_s=100.0)
    assert stall == Stall("weight_load", 120.0, idle)
    assert analyzer.last_progress_line.endswith("Starting to load model m...")  # the waiting message is not one
    analyzer.feed("Loading safetensors checkpoint shards:  50% Completed | 1/2", at=141.0)
    assert analyzer.stalled(now=150.0, threshold_s=100.0) is None


def test_a_stats_line_after_a_hang_is_not_what_the_hang_waited_on() -> None:
    """vLLM logs its stats line on a timer; the first one after a request hung still counts the tokens made
    before, so its non-zero throughput is no progress and never the hang's last line."""
    analyzer = StreamAnalyzer(started_at=0.0)
    analyzer.feed("(APIServer pid=1) INFO:     Application startup complete.", at=1.0)
    watchdog = "(EngineCore_DP0 pid=2) WARNING 12-04 17:09:01 [nccl.py:1] rank0: NCCL watchdog: collective operation timeout is approaching"
    analyzer.feed(watchdog, at=2.0)
    analyzer.feed(
        "(APIServer pid=1) INFO 12-04 17:09:03 [loggers.py:335] Engine 000: Avg prompt throughput: 387.9 tokens/s, "
        "Avg generation throughput: 4.8 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.4%, "
        "Prefix cache hit rate: 49.8%",
        at=10.0,
    )
    assert analyzer.last_progress_line == watchdog
    finding = analyzer.hang_finding(Stall("request", 120.0, analyzer.last_progress_line))
    assert finding.category == "nccl_comm"


def test_a_traceback_the_log_went_quiet_after_is_settled_on_request() -> None:
    """A serving engine logs a failed request's traceback and then nothing: settle() decides what the end of
    the log would, and later lines are still read."""
    analyzer = StreamAnalyzer(started_at=0.0)
    analyzer.feed("(APIServer pid=1) INFO:     Application startup complete.")
    lines = [
        "(APIServer pid=1) ERROR 12-04 10:00:00 [serving.py:1284] Error in chat completion stream generator.",
        "(APIServer pid=1) ERROR 12-04 10:00:00 [serving.py:1284] Traceback (most recent call last):",
        '(APIServer pid=1) ERROR 12-04 10:00:00 [serving.py:1284]   File "/vllm/entrypoints/openai/serving_chat.py", line 9, in gen',
        "(APIServer pid=1) ERROR 12-04 10:00:00 [serving.py:1284]     raise ValueError(msg)",
        "(APIServer pid=1) ERROR 12-04 10:00:00 [serving.py:1284] ValueError: the chat template raised",
    ]
    found = [f for line in lines for f in analyzer.feed(line)]
    assert analyzer.first_error is None and not found  # the message may go on: nothing is certain yet
    settled = analyzer.settle()
    assert [f.line for f in settled if isinstance(f, ErrorFinding)] == [lines[-1]]
    assert analyzer.first_error is not None and analyzer.first_error.phase == "request"
    assert analyzer.settle() == []  # once
    analyzer.feed('(APIServer pid=1) INFO:     127.0.0.1:5000 - "POST /v1/chat/completions HTTP/1.1" 500')
    assert analyzer.first_error.line == lines[-1]


def test_a_hang_is_a_finding_categorized_by_its_last_line() -> None:
    analyzer = StreamAnalyzer(started_at=0.0)
    analyzer.feed("INFO 05-12 02:46:31 [api_server.py:1] non-default args: {}", at=1.0)
    analyzer.feed("(Worker_TP3 pid=9) INFO 05-12 02:46:32 [pynccl.py:111] vLLM is using nccl==2.28.3", at=2.0)
    nccl = analyzer.hang_finding(Stall("gpu_detect", 301.0, "(Worker_TP3 pid=9) vLLM is using nccl==2.28.3"))
    assert (nccl.phase, nccl.category, nccl.during) == ("gpu_detect", "nccl_comm", "hang")
    assert (
        nccl.line
        == "hang: no progress in gpu_detect for 301 s; last line: (Worker_TP3 pid=9) vLLM is using nccl==2.28.3"
    )
    assert "NCCL_DEBUG=INFO" in nccl.hint and not nccl.secondary_oom
    shards = analyzer.hang_finding(Stall("weight_load", 400.0, "Loading safetensors checkpoint shards:  50% Completed"))
    assert (shards.phase, shards.category) == ("weight_load", "weight_load")  # nothing named: the phase's category
    assert shards.signature != nccl.signature
    assert nccl.signature == analyzer.hang_finding(Stall("gpu_detect", 999.0, "other ranks: nccl")).signature
    silent = analyzer.hang_finding(Stall(None, 30.0, ""))
    assert (silent.phase, silent.category) == ("container_init", "other") and silent.line.endswith("last line: (none)")


def test_no_stall_once_ready_or_failed() -> None:
    ready = StreamAnalyzer(started_at=0.0)
    ready.feed("INFO:     Application startup complete.", at=1.0)
    assert ready.stalled(now=1000.0, threshold_s=10.0) is None
    failed = StreamAnalyzer(started_at=0.0)
    # (an error placed at once: the API server's bind, by uvicorn's words)
    failed.feed(
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use",
        at=1.0,
    )
    assert failed.stalled(now=1000.0, threshold_s=10.0) is None


def test_secondary_oom_becomes_known_after_the_finding() -> None:
    analyzer = StreamAnalyzer()
    # A launch's log: a marker places the error at once (an unplaced one would wait for a wrapper that places it).
    analyzer.feed("INFO 05-12 02:46:30 [__init__.py:1] Automatically detected platform cuda.")
    [finding] = analyzer.feed("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)")
    assert isinstance(finding, ErrorFinding)
    assert not finding.secondary_oom
    assert not analyzer.secondary_oom
    analyzer.feed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.")
    assert analyzer.secondary_oom
    assert analyzer.first_error == finding  # emitted once, unchanged


def test_feed_splits_embedded_newlines_and_refuses_after_close() -> None:
    analyzer = StreamAnalyzer()
    analyzer.feed(
        "INFO 05-12 02:46:33 [x.py:1] Starting to load model m...\nOSError: [Errno 98] Address already in use\n"
    )
    assert analyzer.lines == 2
    assert analyzer.first_error is not None and analyzer.first_error.line_no == 2
    analyzer.close()
    with pytest.raises(RuntimeError):
        analyzer.feed("more")


def _oom_run(pid: int, rank: int, gib: str, ts: str, path: str, addr: str) -> str:
    return "\n".join(
        [
            f"(Worker_TP{rank} pid={pid}) INFO {ts} [gpu_worker.py:298] Available KV cache memory: 1.0 GiB",
            *traceback(
                f"(Worker_TP{rank} pid={pid}) ERROR {ts} [multiproc_executor.py:949] ",
                ["worker_main", "capture_model"],
                f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {gib} GiB. GPU {rank} has a total "
                f"capacity of 79.11 GiB; cache at {path}, peer {addr}, rank{rank}",
            ),
        ]
    )


def test_signature_ignores_run_specific_values() -> None:
    one = analyze_text(_oom_run(8456, 3, "1.47", "04-17 02:01:23", "/home/a/.cache/vllm/x1", "10.0.0.2:29500"))
    two = analyze_text(_oom_run(91, 0, "20.00", "11-02 13:00:59", "/root/.cache/vllm/other/y", "[fe80::1]:5000"))
    assert one.first_error is not None and two.first_error is not None
    assert one.first_error.line != two.first_error.line
    assert one.first_error.signature == two.first_error.signature


def test_signature_differs_for_different_failures() -> None:
    oom = analyze_text(_oom_run(1, 0, "1.0", "04-17 02:01:23", "/a/b", "10.0.0.1"))
    nccl = analyze_text("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)")
    other_nccl = analyze_text("RuntimeError: NCCL error: remote process exited or there was a network error")
    signatures = {r.first_error.signature for r in (oom, nccl, other_nccl) if r.first_error}
    assert len(signatures) == 3


def test_later_uncertain_errors_are_dropped_cleanly_once_the_first_is_out() -> None:
    a = traceback("", ["f"], "KeyError: 'a'")
    b = traceback("(Worker_TP1 pid=2) ", ["g"], "KeyError: 'b'")
    header = "(Worker_TP2 pid=3) ERROR 01-01 00:00:00 [x.py:1] something broke"
    c = traceback("(Worker_TP2 pid=3) ERROR 01-01 00:00:00 [x.py:1] ", ["h"], "KeyError: 'c'")
    lines = [*a, *b, header, c[0], "", "(Worker_TP1 pid=2) more", "(Worker_TP1 pid=2) ", *c[1:], "end"]
    result = analyze_text("\n".join(lines))
    assert result.first_error is not None
    assert result.first_error.line == a[-1]
