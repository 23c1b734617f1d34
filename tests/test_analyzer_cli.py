"""`k3repro analyze PATH|- [--json] [--explain]`: output forms and one-line refusals with exit code 2."""

from __future__ import annotations

import argparse
import gzip
import io
import json
import sys
from pathlib import Path

import pytest

from bot import cli
from bot.cli import main
from bot.commands import analyze
from tests.test_analyzer_support import CORPUS

ROOT = "RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)"
LOG = "\n".join(
    [
        "INFO 08-23 08:25:01 [core.py:77] Initializing a V1 LLM engine (v0.11.0) with config: model='m'",
        "Traceback (most recent call last):",
        '  File "/x/vllm/worker.py", line 132, in init_device',
        "    init_worker_distributed_environment()",
        ROOT,
    ]
)


def run(path: str, *, as_json: bool = False, explain: bool = False) -> int:
    return analyze.run(argparse.Namespace(path=path, json=as_json, explain=explain))


def test_parser_registers_the_subcommand() -> None:
    args = cli.build_parser("analyze").parse_args(["analyze", "-", "--json"])
    assert (args.path, args.json, args.func) == ("-", True, analyze.run)


def test_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(LOG)
    assert run(str(log), as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    keys = ["phase", "first_error", "category", "secondary_oom", "hint", "phases_seen", "signature", "phase_from"]
    assert list(out) == [*keys, "confidence"]
    assert (out["phase_from"], out["confidence"]) == ("frames", "high")
    assert out["phase"] == "gpu_detect"
    assert out["first_error"] == {"line": ROOT, "lineno": 5}
    assert out["category"] == "nccl_comm"
    assert out["secondary_oom"] is False
    assert "NCCL_DEBUG=INFO" in out["hint"]
    assert out["phases_seen"] == ["gpu_detect"]
    assert out["signature"].startswith("gpu_detect:nccl_comm:RuntimeError: NCCL error")


def test_human_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(LOG)
    assert run(str(log)) == 0
    out = capsys.readouterr().out
    for expected in (
        "phase:         gpu_detect (from frames)",
        "category:      nccl_comm",
        f"line 5: {ROOT}",
        "secondary OOM: no",
    ):
        assert expected in out
    assert "hint:" in out and f"  > {ROOT}" in out and "init_worker_distributed_environment" in out


def test_explain_says_why_this_line_phase_and_category(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wrapper = "RuntimeError: Engine core initialization failed. See root cause above."
    log = tmp_path / "vllm.log"
    log.write_text(f"{LOG}\n{wrapper}\n")
    assert main(["analyze", "--explain", str(log)]) == 0
    why = capsys.readouterr().out.split("\nwhy:\n")[1].splitlines()
    assert why[0] == "  line: the earliest error a root rule names (nccl)"
    assert why[1].startswith("  phase: gpu_detect (from frames): traceback frame File ") and why[1].endswith(
        "in init_device"
    )
    assert why[2] == "  category: nccl_comm: rule nccl"
    assert why[3] == f"  wrapper passed over: line 6 (engine_core_init_failed): {wrapper}"
    assert run(str(log), as_json=True, explain=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert [line.strip() for line in why] == out["explain"]
    assert run(str(log), as_json=True) == 0
    assert "explain" not in json.loads(capsys.readouterr().out)  # the contract without the flag is unchanged


def test_explain_names_the_stop_of_a_healthy_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO:     Application startup complete.\n"
        "(APIServer pid=7) INFO 03-02 10:00:00 [launcher.py:99] [shutdown] API server: shutdown triggered\n"
        "(APIServer pid=7) ERROR 03-02 10:00:00 [async_llm.py:480] AsyncLLM output_handler failed.\n"
    )
    assert main(["analyze", "--explain", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("healthy")
    assert "stop: line 2 stopped a serving server on purpose" in out and "1 error line(s) after it" in out


def test_healthy_log_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "ok.log"
    log.write_text("INFO:     Started server process [1]\nINFO:     Application startup complete.\n")
    assert run(str(log), as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["phase"], out["first_error"], out["category"], out["signature"]) == (None, None, None, "")
    assert run(str(log)) == 0
    assert capsys.readouterr().out.startswith("healthy")


def test_standard_input(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LOG.encode())))
    assert run("-", as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["category"] == "nccl_comm"


def refused(path: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert run(path) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("k3repro analyze: ")
    return lines[0]


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "No such file" in refused(str(tmp_path / "nope.log"), capsys)


def test_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "Is a directory" in refused(str(tmp_path), capsys)


def test_unreadable_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def deny(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(analyze, "analyze_path", deny)
    assert "Permission denied" in refused(str(tmp_path / "x.log"), capsys)


def test_binary_junk(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "core.bin"
    junk.write_bytes(bytes(range(256)) * 64)
    assert "binary data" in refused(str(junk), capsys)


def test_oversized_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(analyze, "MAX_BYTES", 1 << 20)
    big = tmp_path / "big.log"
    big.write_text("INFO 01-01 00:00:00 [x.py:1] ok\n" * 70_000)
    assert "larger than 1 MiB" in refused(str(big), capsys)


def test_a_rotated_gzip_log_reads_as_the_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """logrotate and the kubelet keep older logs gzipped: a file or a pipe of one reads as the plain log."""
    plain = CORPUS / "logs" / "018.log"  # CR progress bars, an OOM after a compile error: line numbers matter
    packed = tmp_path / "vllm.log.1.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert run(str(plain), as_json=True) == 0
    want = json.loads(capsys.readouterr().out)
    assert run(str(packed), as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == want
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(packed.read_bytes())))
    assert run("-", as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == want


def test_a_damaged_or_hostile_gzip_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = gzip.compress(LOG.encode() * 50)
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(whole[: len(whole) // 2])  # a rotation copied while it was written
    assert "a damaged or cut-off gzip file" in refused(str(cut), capsys)
    binary = tmp_path / "core.gz"
    binary.write_bytes(gzip.compress(bytes(range(256)) * 64))
    assert "gzip of binary data" in refused(str(binary), capsys)
    monkeypatch.setattr(analyze, "MAX_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.log.gz"  # 64 MiB of log lines in a few hundred KiB: stopped at the limit
    bomb.write_bytes(gzip.compress(b"INFO 01-01 00:00:00 [x.py:1] ok\n" * (2 << 20)))
    assert bomb.stat().st_size < 1 << 20 and "larger than 1 MiB" in refused(str(bomb), capsys)


def test_start_with_a_log_that_cannot_be_used_is_one_line_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "k3repro.toml"
    config.write_text(
        'store = "k3.db"\n[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "i"\nlaunch = "vllm serve m"\n'
    )
    healthy = tmp_path / "healthy.log"
    healthy.write_text("(APIServer pid=1) INFO 05-12 02:46:01 [api_server.py:1] Application startup complete.\n")
    cases = [
        (tmp_path / "missing.log", "missing.log: No such file or directory"),
        (healthy, "healthy.log: the log shows no error to reproduce; nothing was started"),
    ]
    for log, message in cases:
        assert main(["--config", str(config), "start", "cluster-a", "--log", str(log)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.strip().endswith(message), err
    assert not (tmp_path / "k3.db").exists()  # nothing was recorded
