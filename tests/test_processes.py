"""The console scripts as a person runs them: the runner daemon, the CLI, the demo."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from bot.config import ClientTls
from bot.runner_client import open_channel
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from runner.engines.process import process_groups
from tests.k3fixtures import KIMI_LAUNCH

BIN = Path(sys.executable).parent


def _runner_toml(certs: DevCerts, tmp_path: Path, port: int) -> Path:
    path = tmp_path / "runner.toml"
    path.write_text(
        f'name = "gpu-sig"\ncluster = "cluster-a"\nlisten = "127.0.0.1:{port}"\nheartbeat_s = 0.5\n'
        'allowed_images = ["vllm/vllm-openai:*"]\n'
        f'[tls]\ncert = "{certs.runner_cert}"\nkey = "{certs.runner_key}"\nclient_ca = "{certs.ca}"\n'
        '[engine]\nbackend = "sim"\nstop_grace_s = 2\n[engine.sim]\nscenario = "healthy"\nspeed = 1\n'
    )
    return path


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_sigterm_cancels_active_runs_and_reports_them(certs: DevCerts, tmp_path: Path) -> None:
    port = _free_port()
    daemon = subprocess.Popen(
        [BIN / "k3repro-runner", "serve", "--config", _runner_toml(certs, tmp_path, port)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    tls = ClientTls(ca=certs.ca, cert=certs.bot_cert, key=certs.bot_key)
    try:
        async with open_channel(f"127.0.0.1:{port}", tls) as channel:
            stub = pb_grpc.RunnerStub(channel)
            await asyncio.wait_for(_ready(stub), 20)
            request = pb.StartRunRequest(
                run_id="r-term", cluster="cluster-a", image="vllm/vllm-openai:kimi-k3", launch_argv=KIMI_LAUNCH.split()
            )
            events = stub.StartRun(request, timeout=60)
            engine_pgid = 0
            async for event in events:
                if event.WhichOneof("payload") == "phase_reached":
                    (engine_pgid,) = process_groups({"r-term"})
                    break
            assert engine_pgid
            daemon.send_signal(signal.SIGTERM)
            rest = [e async for e in events if e.seq]
        assert rest[-1].run_finished.status == pb.RUN_STATUS_CANCELLED
        assert "shutting down" in rest[-1].run_finished.summary
        assert daemon.wait(timeout=20) == 0
        try:
            os.killpg(engine_pgid, 0)
            raise AssertionError("the engine's process group outlived the runner")
        except ProcessLookupError:
            pass
    finally:
        if daemon.poll() is None:
            daemon.kill()


async def _ready(stub: pb_grpc.RunnerStub) -> None:
    while True:
        try:
            await stub.Describe(pb.DescribeRequest(), timeout=1)
            return
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)


def test_demo_prints_the_failing_phase_and_first_error() -> None:
    started = time.monotonic()
    result = subprocess.run([BIN / "k3repro", "demo"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "🔥 First error" in out and "Phase: gpu_detect · Category: nccl_comm · Secondary OOM: no" in out
    assert "| (Worker_TP3 pid=" in out and "NCCL error" in out  # the first error line, as a code line
    assert "❌ minimal_launch — failed in gpu_detect" in out
    assert "🔎 Verdict: continue" in out
    assert time.monotonic() - started < 60


def test_demo_json_is_the_run_report() -> None:
    result = subprocess.run([BIN / "k3repro", "demo", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {
        "run_id", "decision", "verdict_line", "reasons", "baseline", "checklist", "first_error", "ladder",
        "trigger_step", "candidates", "launches", "launch_list", "minimal_failing_command",
    }  # fmt: skip
    assert report["verdict_line"].startswith("the minimal launch fails in gpu_detect [nccl_comm]: RuntimeError: NCCL")
    assert "Next: " in report["verdict_line"] and report["baseline"]["verdict"] in ("pass", "warn")
    assert [launch["source"] for launch in report["launch_list"]] == ["minimal_launch", "minimal_launch/attempt-2"]
    assert report["minimal_failing_command"] is None  # not a minimize run
    assert report["decision"] == "continue"
    assert report["first_error"]["phase"] == "gpu_detect" and report["first_error"]["category"] == "nccl_comm"
    assert (report["ladder"], report["trigger_step"], report["launches"]) == ([], None, 2)
    assert (
        report["checklist"]["failure_repeated"]["state"] == "holds"
        and report["checklist"]["revertible_baseline"]["state"] == "fails"
    )


def test_cli_bad_input_gets_one_line_and_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "k3repro.toml"
    config.write_text(
        '[clusters.cluster-a]\nrunners = ["127.0.0.1:9"]\nimage = "vllm/vllm-openai:kimi-k3"\n'
        'launch = "vllm serve m --tensor-parallel-size 8"\n'
    )
    cases = [
        (["start", "cluster-z"], "k3repro: unknown cluster 'cluster-z' (known: cluster-a)"),
        (["show", "nope"], "k3repro: no run 'nope'"),
        (["start", "cluster-a"], "k3repro: no runner of cluster cluster-a can take the run: 127.0.0.1:9 unreachable"),
    ]
    for args, message in cases:
        result = subprocess.run(
            [BIN / "k3repro", "--config", config, *args], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith(message), result.stderr
        assert result.stderr.count("\n") == 1
    missing = subprocess.run(
        [BIN / "k3repro", "--config", tmp_path / "absent.toml", "runs"], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "absent.toml" in missing.stderr
    runs = subprocess.run([BIN / "k3repro", "--config", config, "runs"], capture_output=True, text=True)
    assert runs.stdout == "no runs yet\n"


def _bot_toml(certs: DevCerts, tmp_path: Path, port: int) -> Path:
    path = tmp_path / "k3repro.toml"
    path.write_text(
        f'store = "{tmp_path / "k3.db"}"\nconnect_timeout_s = 3\nreconnect_for_s = 20\n'
        f'[tls]\nca = "{certs.ca}"\ncert = "{certs.bot_cert}"\nkey = "{certs.bot_key}"\n'
        f'[clusters.cluster-a]\nrunners = ["127.0.0.1:{port}"]\nimage = "vllm/vllm-openai:kimi-k3"\n'
        f'launch = "{KIMI_LAUNCH}"\nprofile = "kimi-k3"\n'
    )
    return path


def _killed_mid_run(config: Path) -> str:
    """`k3repro start` SIGKILLed while it follows its run (after the run's first stage has finished)."""
    cli = subprocess.Popen(
        [BIN / "k3repro", "--config", config, "start", "cluster-a"], stdout=subprocess.PIPE, text=True
    )  # fmt: skip
    assert cli.stdout is not None
    header = cli.stdout.readline()
    assert header.startswith("run "), header
    for line in cli.stdout:
        if "freeze" in line:
            break
    cli.kill()
    cli.wait(timeout=10)
    return header.split()[1]


async def _active_on_runner(stub: pb_grpc.RunnerStub) -> list[str]:
    return list((await stub.Describe(pb.DescribeRequest(), timeout=3)).active_run_ids)


@pytest.mark.timeout(400)
async def test_a_cli_killed_mid_run_does_not_leave_its_cluster_active(certs: DevCerts, tmp_path: Path) -> None:
    """The next `runs` or `start` asks the runner: a run it still runs keeps the cluster busy; one it has
    ended is replayed from its journal into the store (its run_finished included), and the cluster is free."""
    from bot.store import Store

    port = _free_port()
    runner_toml = _runner_toml(certs, tmp_path, port)
    runner_toml.write_text(runner_toml.read_text().replace("speed = 1\n", "speed = 80\n"))  # a run: ~4 s
    daemon = subprocess.Popen(
        [BIN / "k3repro-runner", "serve", "--config", runner_toml], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    config = _bot_toml(certs, tmp_path, port)
    tls = ClientTls(ca=certs.ca, cert=certs.bot_cert, key=certs.bot_key)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [BIN / "k3repro", "--config", config, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    async def ended(stub: pb_grpc.RunnerStub, run_id: str) -> None:
        while run_id in await _active_on_runner(stub):
            await asyncio.sleep(0.2)

    try:
        async with open_channel(f"127.0.0.1:{port}", tls) as channel:
            stub = pb_grpc.RunnerStub(channel)
            await asyncio.wait_for(_ready(stub), 20)
            first = _killed_mid_run(config)
            assert first in await _active_on_runner(stub)
            busy = cli("start", "cluster-a")  # the runner still runs it: refused, truthfully
            assert busy.returncode == 2 and f"already has an active run: {first}" in busy.stderr
            await asyncio.wait_for(ended(stub, first), 120)
            assert Store(tmp_path / "k3.db").get_run(first).status == "running"  # nobody followed it to its end
            listed = cli("runs")
            assert listed.returncode == 0 and f"{first}  cluster-a      completed" in listed.stdout
            store = Store(tmp_path / "k3.db")
            events = store.events(first)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert events[-1].run_finished.status == pb.RUN_STATUS_COMPLETED
            assert store.get_run(first).summary == events[-1].run_finished.summary

            second = _killed_mid_run(config)
            await asyncio.wait_for(ended(stub, second), 120)
            third = _killed_mid_run(config)  # start settles the stale row itself, and its run is accepted
            assert third not in (first, second) and third in await _active_on_runner(stub)
            assert Store(tmp_path / "k3.db").get_run(second).status == "completed"
    finally:
        daemon.kill()
        daemon.wait(timeout=10)
