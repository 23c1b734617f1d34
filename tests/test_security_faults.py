"""Faults an unlucky operator meets, with real parts: a finished run watched again, a second runner on the same
state dir or port, a journal that cannot write (a real SQLite failure), programs that are not configured."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import grpc
import pytest

from bot.runner_client import KEEPALIVE_OPTIONS, open_channel
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from runner.config import parse_runner_config
from runner.daemon import MIN_PING_INTERVAL_MS, DaemonStartError, RunnerDaemon
from runner.engines.process import ProcessBackend, process_groups
from tests.k3fixtures import KIMI_LAUNCH, runner_data, running_runner
from tests.test_runner_grpc import _start, _tls


async def _events(stub: pb_grpc.RunnerStub, call: object) -> list[pb.RunEvent]:
    return [e async for e in call if e.seq]  # type: ignore[attr-defined]


async def test_watching_a_finished_run_replays_and_ends(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path)) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            stub = pb_grpc.RunnerStub(channel)
            events = await _events(stub, stub.StartRun(_start("r-done"), timeout=60))
            last = events[-1].seq
            again = await _events(stub, stub.WatchRun(pb.WatchRunRequest(run_id="r-done", after_seq=last), timeout=5))
            replay = await _events(stub, stub.WatchRun(pb.WatchRunRequest(run_id="r-done", after_seq=0), timeout=5))
    assert [e.seq for e in again] == [last] and again[0].HasField("run_finished")  # ends, instead of nothing
    assert replay == events


async def test_a_second_runner_on_the_same_state_dir_or_port_is_refused(certs: DevCerts, tmp_path: Path) -> None:
    data = runner_data(certs, tmp_path / "a")
    async with running_runner(data) as first:
        with pytest.raises(DaemonStartError, match=r"state_dir .* is in use by another runner \(pid \d+\)"):
            RunnerDaemon(parse_runner_config(data, base=tmp_path, origin="test"))
        other = runner_data(certs, tmp_path / "b", listen=f"127.0.0.1:{first.port}")
        second = RunnerDaemon(parse_runner_config(other, base=tmp_path, origin="test"))
        with pytest.raises(DaemonStartError, match=r"cannot listen on 127\.0\.0\.1:"):
            await second.start()
        assert second.journal.unfinished_runs() == []  # it touched nothing: no leftover clean-up ran
        async with open_channel(f"127.0.0.1:{first.port}", _tls(certs)) as channel:
            assert (await pb_grpc.RunnerStub(channel).Describe(pb.DescribeRequest(), timeout=5)).name == "gpu-test"


async def test_a_journal_that_cannot_write_ends_the_run_visibly_with_no_seq_lost(
    certs: DevCerts, tmp_path: Path
) -> None:
    """A real SQLite failure (a trigger raising "database or disk is full" from the 12th event on): the run ends
    as an error that says why, its engine is stopped, the runner is free, and the seqs it has are contiguous."""
    async with running_runner(runner_data(certs, tmp_path, scenario="healthy")) as daemon:
        with sqlite3.connect(daemon.config.journal_path) as db:
            db.execute(
                "CREATE TRIGGER full BEFORE INSERT ON events WHEN NEW.seq >= 12 "
                "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
            )
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            stub = pb_grpc.RunnerStub(channel)
            events = await asyncio.wait_for(_events(stub, stub.StartRun(_start("r-full"), timeout=120)), 120)
            finished = events[-1].run_finished
            assert finished.status == pb.RUN_STATUS_ERROR and "could not record an event" in finished.summary
            assert "database or disk is full" in finished.summary
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            assert not daemon.hub.active and process_groups({"r-full"}) == set()
            with sqlite3.connect(daemon.config.journal_path) as db:  # space freed: the runner goes on
                db.execute("DROP TRIGGER full")
            again = await _events(stub, stub.StartRun(_start("r-after"), timeout=120))
            assert again[-1].run_finished.status == pb.RUN_STATUS_COMPLETED


def test_keepalive_is_agreed_by_both_sides() -> None:
    """The bot pings no more often than the runner permits, and the runner permits pings without calls."""
    options = dict(KEEPALIVE_OPTIONS)
    assert int(options["grpc.keepalive_time_ms"]) >= MIN_PING_INTERVAL_MS
    assert options["grpc.keepalive_permit_without_calls"] == 1


def _program(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text('#!/bin/sh\necho ran >> "$0.ran"\n')
    path.chmod(0o755)
    return path


async def test_the_process_backend_runs_only_configured_executables(
    certs: DevCerts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allowed = _program(tmp_path / "opt", "vllm")
    scratch = tmp_path / "scratch"
    lookalikes = [_program(scratch, name) for name in ("vllm", "vllm-not-really", "python-evil")]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "vllm").symlink_to(allowed)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    data = runner_data(certs, tmp_path / "state")
    data["engine"] = {"backend": "process", "executables": ["vllm"], "stop_grace_s": 1}
    backend = ProcessBackend(executables=parse_runner_config(data, base=tmp_path, origin="t").engine.executables)
    assert backend.refusal(["vllm", "serve", "m"]) == ""  # through PATH and a symlink: the configured program
    async with running_runner(data) as daemon:
        async with open_channel(f"127.0.0.1:{daemon.port}", _tls(certs)) as channel:
            stub = pb_grpc.RunnerStub(channel)
            for program in lookalikes:
                argv = [str(program), *KIMI_LAUNCH.split()[1:]]
                request = pb.StartRunRequest(
                    run_id="r-evil", cluster="cluster-a", image="vllm/vllm-openai:kimi-k3", launch_argv=argv
                )
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await _events(stub, stub.StartRun(request, timeout=10))
                assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
                details = caught.value.details() or ""
                assert "is not one of this runner's [engine] executables" in details and "\n" not in details
        assert daemon.journal.request("r-evil") is None  # refused before anything was recorded
    assert not any(p.with_name(p.name + ".ran").exists() for p in lookalikes)
