"""The bot core against a real runner: dispatch, store, resume after a lost stream, clear refusals."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path
from typing import ClassVar

import pytest

from bot.answers import cancelled
from bot.cli import main as cli
from bot.coordinator import Coordinator
from bot.refusal import Refused
from bot.rich import mrkdwn
from bot.store import AsyncStore, Store
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc
from tests.k3fixtures import KIMI_LAUNCH, TcpProxy, bot_config, runner_data, running_runner


class Recorder:
    def __init__(self) -> None:
        self.events: list[pb.RunEvent] = []

    async def __call__(self, event: pb.RunEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.WhichOneof("payload") or "" for e in self.events]


def _dump(store_path: Path) -> tuple[list[dict[str, object]], list[tuple[object, ...]]]:
    store = Store(store_path)
    runs = list(store.db.table("runs").rows)
    events = store.db.execute("SELECT run_id, seq FROM run_events ORDER BY run_id, seq").fetchall()
    audit = list(store.db.table("audit_log").rows)
    store.close()
    return runs + audit, events


RUNNER_STUB = runner_pb2_grpc.RunnerStub


class CountingStub:
    """The runner's stub as the bot's consumer uses it, counting the streams it opens."""

    opened: ClassVar[list[str]] = []

    def __init__(self, channel: object) -> None:
        self._stub = RUNNER_STUB(channel)

    def StartRun(self, request: pb.StartRunRequest) -> object:
        CountingStub.opened.append("StartRun")
        return self._stub.StartRun(request)

    def WatchRun(self, request: pb.WatchRunRequest) -> object:
        CountingStub.opened.append("WatchRun")
        return self._stub.WatchRun(request)

    def __getattr__(self, name: str) -> object:  # Describe, CancelRun: as they are
        return getattr(self._stub, name)


async def test_a_started_run_is_followed_on_the_stream_that_started_it(
    certs: DevCerts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One RPC stream per run while nothing is lost: start returns at the first event, follow reads on from the
    same StartRun stream (no WatchRun), and every event arrives once, in order."""
    import bot.consumer

    monkeypatch.setattr(bot.consumer.pb_grpc, "RunnerStub", CountingStub)
    CountingStub.opened = []
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="healthy")) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        started = await core.start("cluster-a", "U1")
        recorder = Recorder()
        finished = await core.follow(started, recorder)
        stored = await store.call(Store.events, started.run_id)
        store.close()
    assert finished.status == pb.RUN_STATUS_COMPLETED
    assert CountingStub.opened == ["StartRun"]
    seqs = [event.seq for event in recorder.events]
    assert seqs == list(range(1, len(seqs) + 1)) and [event.seq for event in stored] == seqs


async def test_failing_run_reports_phase_and_first_error(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="demo")) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        started = await core.start("cluster-a", "U1")
        recorder = Recorder()
        finished = await core.follow(started, recorder)
        store.close()
    assert finished.status == pb.RUN_STATUS_COMPLETED
    assert finished.decision == pb.DECISION_CONTINUE
    first = next(e.first_error for e in recorder.events if e.WhichOneof("payload") == "first_error")
    assert first.phase == pb.PHASE_GPU_DETECT
    assert first.category == pb.ERROR_CATEGORY_NCCL_COMM
    assert "NCCL error" in first.line
    stages = [
        (e.stage_finished.stage, e.stage_finished.status) for e in recorder.events if e.HasField("stage_finished")
    ]
    assert stages == [
        (pb.STAGE_FREEZE, pb.STAGE_STATUS_OK),
        (pb.STAGE_BASELINE, pb.STAGE_STATUS_OK),
        (pb.STAGE_MINIMAL_LAUNCH, pb.STAGE_STATUS_FAILED),
        (pb.STAGE_SINGLE_REQUEST, pb.STAGE_STATUS_SKIPPED),
        (pb.STAGE_LADDER, pb.STAGE_STATUS_SKIPPED),
        (pb.STAGE_VERDICT, pb.STAGE_STATUS_OK),
    ]
    minimal = next(e.artifact.content for e in recorder.events if e.artifact.name == "minimal_command")
    assert "--tool-call-parser" not in minimal and "--tensor-parallel-size 8" in minimal
    assert "--no-enable-prefix-caching" in minimal
    run = Store(config.store).get_run(started.run_id)
    assert (run.status, run.decision) == ("completed", "continue")
    assert "gpu_detect" in (run.summary or "")


async def test_healthy_run_sends_the_fixed_request_three_times(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="healthy")) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        recorder = Recorder()
        core = Coordinator(config, store)
        await core.follow(await core.start("cluster-a", "U1"), recorder)
        store.close()
    ladder_starts = next(
        i
        for i, e in enumerate(recorder.events)
        if e.stage_started.stage == pb.STAGE_LADDER and e.HasField("stage_started")
    )
    before_ladder = recorder.events[:ladder_starts]
    results = [e.request_result for e in before_ladder if e.HasField("request_result")]
    assert [r.attempt for r in results] == [1, 2, 3]
    assert all(r.http_status == 200 and r.max_tokens == 16 for r in results)
    assert all(r.prompt_tokens > 0 and 0 < r.completion_tokens <= 16 and r.finish_reason for r in results)
    phases = [e.phase_reached.phase for e in before_ladder if e.HasField("phase_reached")]
    assert phases[-2:] == [pb.PHASE_API_LISTEN, pb.PHASE_REQUEST]  # the request phase starts with the first request
    assert phases == sorted(phases)
    checks = {e.checklist_item.item: e.checklist_item.state for e in recorder.events if e.HasField("checklist_item")}
    assert checks[pb.CHECKLIST_ID_SINGLE_REQUEST_FIXED] == pb.CHECKLIST_STATE_HOLDS
    assert "first_error" not in recorder.kinds()


async def test_lost_stream_resumes_without_lost_or_duplicated_events(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="healthy")) as daemon:
        proxy = TcpProxy(daemon.port)
        await proxy.start()
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{proxy.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        started = await core.start("cluster-a", "U1")
        recorder = Recorder()
        cuts = 0

        async def cut_twice(event: pb.RunEvent) -> None:
            nonlocal cuts
            await recorder(event)
            if event.seq in (3, 9) and cuts < 2:
                cuts += 1
                proxy.cut()

        finished = await core.follow(started, cut_twice)
        stored = await store.call(Store.events, started.run_id)
        store.close()
        journal = list(daemon.journal.events(started.run_id, 0))
        await proxy.stop()
    assert cuts == 2 and proxy.connections >= 3  # Describe, the first stream, and at least one resume per cut
    assert finished.status == pb.RUN_STATUS_COMPLETED
    assert [e.seq for e in recorder.events] == list(range(1, len(journal) + 1))
    assert stored == journal
    assert recorder.events == journal


async def test_unknown_cluster_is_refused_and_changes_nothing(certs: DevCerts, tmp_path: Path) -> None:
    config = bot_config(certs, tmp_path / "k3.db", ["127.0.0.1:9"])
    store = AsyncStore(config.store)
    with pytest.raises(Refused, match=r"unknown cluster 'cluster-z' \(known: cluster-a\)"):
        await Coordinator(config, store).start("cluster-z", "U1")
    store.close()
    assert _dump(config.store) == ([], [])


async def test_unknown_flag_is_refused_before_anything_is_dispatched(certs: DevCerts, tmp_path: Path) -> None:
    config = bot_config(certs, tmp_path / "k3.db", ["127.0.0.1:9"], launch=KIMI_LAUNCH + " --enable-turbo")
    store = AsyncStore(config.store)
    with pytest.raises(Refused, match="launch command: unrecognized arguments: --enable-turbo"):
        await Coordinator(config, store).start("cluster-a", "U1")
    store.close()
    assert _dump(config.store) == ([], [])


async def test_runner_down_is_a_clear_refusal(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner")) as daemon:
        dead_port = daemon.port
    config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{dead_port}"])
    store = AsyncStore(config.store)
    with pytest.raises(
        Refused, match=f"no runner of cluster cluster-a can take the run: 127.0.0.1:{dead_port} unreachable"
    ):
        await Coordinator(config, store).start("cluster-a", "U1")
    store.close()
    assert _dump(config.store) == ([], [])


async def test_a_start_the_runner_refuses_stores_only_its_audit_line(certs: DevCerts, tmp_path: Path) -> None:
    data = runner_data(certs, tmp_path / "runner", allowed_images=["registry.local/vllm:*"])
    async with running_runner(data) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        with pytest.raises(Refused, match=r"refused the run: .*not allowlisted"):
            await Coordinator(config, store).start("cluster-a", "U1")
        store.close()
    rows, events = _dump(config.store)
    assert events == [] and [(row["action"], row["target"]) for row in rows] == [("start refused", "cluster-a")]
    assert "not allowlisted" in str(rows[0]["detail"])


async def test_second_start_points_to_the_active_run(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="healthy", speed=2)) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        started = await core.start("cluster-a", "U1")
        first_event = asyncio.Event()

        async def note(event: pb.RunEvent) -> None:
            first_event.set()

        following = asyncio.create_task(core.follow(started, note))
        await asyncio.wait_for(first_event.wait(), 30)
        with pytest.raises(Refused, match=f"already has an active run: {started.run_id}"):
            await core.start("cluster-a", "U2")
        result = await core.cancel(started.run_id, "U1")
        assert result.run_id == started.run_id and "cancelled" in result.answer and not result.ended
        finished = await following
        again = await core.cancel(started.run_id, "U1")  # ended: the runner is not asked, nothing is audited
        assert (again.ended, mrkdwn(cancelled(again))) == (
            "cancelled",
            f"run `{started.run_id}` already ended (cancelled)",
        )
        store.close()
    assert finished.status == pb.RUN_STATUS_CANCELLED
    run = Store(config.store).get_run(started.run_id)
    assert run.status == "cancelled"
    actions = [entry.action for entry in Store(config.store).audit_entries()]
    assert actions == ["cancel", "start"]


async def test_notes_reach_the_next_runs_frozen_scene(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="demo")) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        await core.note("cluster-a", "driver  580.82 ->\n580.95 on gpu-a1", "U1")
        with pytest.raises(Refused, match="unknown cluster"):
            await core.note("cluster-z", "x", "U1")
        with pytest.raises(Refused, match="needs text"):
            await core.note("cluster-a", "   ", "U1")
        with pytest.raises(Refused, match="at most 500 characters"):
            await core.note("cluster-a", "x" * 501, "U1")
        recorder = Recorder()
        await core.follow(await core.start("cluster-a", "U1"), recorder)
        store.close()
    scene = next(e.artifact.content for e in recorder.events if e.artifact.name == "fingerprint")
    assert '"what": "driver 580.82 -> 580.95 on gpu-a1"' in scene
    assert '"by": "U1"' in scene


async def test_dispatch_skips_busy_and_unreachable_runners(certs: DevCerts, tmp_path: Path) -> None:
    async with (
        running_runner(runner_data(certs, tmp_path / "r1", scenario="healthy", speed=1)) as busy,
        running_runner(runner_data(certs, tmp_path / "r2", scenario="demo")) as idle,
    ):
        config = bot_config(
            certs, tmp_path / "k3.db", ["127.0.0.1:9", f"127.0.0.1:{busy.port}", f"127.0.0.1:{idle.port}"]
        )
        busy.hub.start(
            pb.StartRunRequest(
                run_id="elsewhere",
                cluster="cluster-a",
                image="vllm/vllm-openai:kimi-k3",
                launch_argv=KIMI_LAUNCH.split(),
            )
        )
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        states = {state.address: state for _, state in await core.runners("cluster-a")}
        assert states["127.0.0.1:9"].description is None and states["127.0.0.1:9"].error
        assert list(states[f"127.0.0.1:{busy.port}"].description.active_run_ids) == ["elsewhere"]  # type: ignore[union-attr]
        assert states[f"127.0.0.1:{idle.port}"].idle
        started = await core.start("cluster-a", "U1")
        assert started.runner == f"127.0.0.1:{idle.port}"
        finished = await core.follow(started, Recorder())
        store.close()
        await busy.hub.cancel("elsewhere", "test over")
    assert finished.status == pb.RUN_STATUS_COMPLETED


async def test_the_terminal_prints_the_operations_answers_in_slacks_words(
    certs: DevCerts, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`k3repro runners`, `note` and `cancel` render the operations' typed results through bot/answers.py,
    the lines Slack posts, without the mrkdwn marks; the terminal sees every runner's address."""
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="demo")) as daemon:
        config = tmp_path / "k3.toml"
        config.write_text(
            f'store = "{tmp_path / "k3.db"}"\n'
            f'[tls]\nca = "{certs.ca}"\ncert = "{certs.bot_cert}"\nkey = "{certs.bot_key}"\n'
            f'[clusters.cluster-a]\nrunners = ["127.0.0.1:{daemon.port}", "127.0.0.1:9"]\n'
            f'image = "vllm/vllm-openai:kimi-k3"\nlaunch = "{KIMI_LAUNCH}"\n'
        )
        codes = [
            await asyncio.to_thread(cli, ["--config", str(config), *argv])
            for argv in (["runners"], ["note", "cluster-a", "driver 580.95"], ["cancel", "nosuch"])
        ]
    out, err = capsys.readouterr()
    runners, noted = out.splitlines()[:2], out.splitlines()[2]
    assert codes == [0, 0, 2]
    assert runners[0] == f"• cluster-a 127.0.0.1:{daemon.port} gpu-test ({socket.gethostname()}) sim idle"
    assert runners[1].startswith("• cluster-a 127.0.0.1:9 unreachable: ")
    assert re.fullmatch(r"noted for cluster-a at \S+: driver 580\.95", noted) and "`" not in out
    assert err.strip() == "k3repro: no run 'nosuch'"
