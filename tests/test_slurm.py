"""The `slurm` isolation provider against a real single-node Slurm: a rerun goes through `sbatch --exclusive`,
its runner (`k3repro-runner serve --once`) comes up inside the job, the verdict arrives, and no job is left;
cancelling mid-run leaves no job; a job that never starts is reported after the queue-wait limit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bot.coordinator import Coordinator
from bot.isolation import Placement
from bot.main import resume_runs
from bot.refusal import Refused
from bot.rerun import rerun_isolated
from bot.store import AsyncStore, Store
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from tests.k3fixtures import SIM_SPEED, bot_config, rerun_left_running, runner_data, running_runner
from tests.slurm import DOWN, UP, Slurm, running_slurm

SCRIPT = Path(__file__).resolve().parent.parent / "deploy" / "slurm" / "k3repro-isolated.sbatch"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
    with running_slurm(tmp_path_factory.mktemp("slurm")) as cluster, pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(cluster.conf))  # sbatch, squeue and scancel, as the bot runs them
        yield cluster


def _runner_toml(certs: DevCerts, folder: Path, speed: float) -> Path:
    """The isolated runner's config, on the 'shared file system' the job reads it from."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "isolated-runner.toml"
    path.write_text(
        f"""name = "gpu-isolated"
cluster = "cluster-a"
listen = "127.0.0.1:0"
state_dir = "{folder / "state"}"
labels = ["isolated"]
allowed_images = ["vllm/vllm-openai:*", "vllm/vllm-openai@sha256:*"]
heartbeat_s = 0.5
[tls]
cert = "{certs.runner_cert}"
key = "{certs.runner_key}"
client_ca = "{certs.ca}"
[engine]
backend = "sim"
stop_grace_s = 2
[engine.sim]
scenario = "healthy"
speed = {speed}
"""
    )
    return path


@contextlib.asynccontextmanager
async def bot(
    certs: DevCerts, tmp_path: Path, *, partition: str = UP, speed: float = SIM_SPEED, queue_wait_s: float = 30
) -> AsyncIterator[tuple[Coordinator, str]]:
    """A cluster whose regular runner has a leftover process, and Slurm as its isolation provider; yields the
    bot core and a finished original run."""
    async with running_runner(runner_data(certs, tmp_path / "regular", scenario="leftover-process")) as a:
        isolation = {
            "provider": "slurm",
            "partition": partition,
            "time_limit": "00:10:00",
            "script": str(SCRIPT),
            "runner_config": str(_runner_toml(certs, tmp_path / "shared", speed)),
            "work_dir": str(tmp_path / "shared" / "jobs"),
            "queue_wait_s": queue_wait_s,
            "poll_s": 0.2,
        }
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{a.port}"], isolation=isolation)
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        started = await core.start("cluster-a", "U1")
        await core.follow(started, _ignore)
        try:
            yield core, started.run_id
        finally:
            store.close()


async def test_a_rerun_runs_in_an_exclusive_batch_job_that_is_gone_afterwards(
    slurm: Slurm, certs: DevCerts, tmp_path: Path
) -> None:
    seen: list[str] = []

    async def started(rerun_id: str, placement: Placement) -> None:
        seen.extend(slurm.jobs())

    async with bot(certs, tmp_path) as (core, original):
        outcome = await rerun_isolated(core, original, "U2", _ignore, on_started=started)
        row = await core.store.call(Store.get_run, outcome.run_id)
    job = outcome.placement.handle
    assert seen == [f"{job} RUNNING"]  # while the rerun ran, its job was the one running job
    assert outcome.placement.where == f"slurm job {job} on node localhost"
    assert outcome.placement.address.startswith("localhost:") and row.runner == outcome.placement.address
    assert outcome.comparison["verdict"] == "not_reproduced"
    assert any("foreign GPU memory" in d["path"] for d in outcome.comparison["differences"])
    assert slurm.jobs() == []  # the job ended with its run
    log = (tmp_path / "shared" / "jobs" / outcome.run_id / "job.out").read_text()
    assert f"run {outcome.run_id} started" in log and "listening on port" in log


async def test_cancelling_mid_run_cancels_the_run_and_leaves_no_job(
    slurm: Slurm, certs: DevCerts, tmp_path: Path
) -> None:
    placed: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def started(rerun_id: str, placement: Placement) -> None:
        placed.set_result(rerun_id)

    async def first_launch(event: pb.RunEvent) -> None:
        if event.HasField("stage_started") and event.stage_started.stage == pb.STAGE_MINIMAL_LAUNCH:
            await core.cancel(await placed, "U2")

    async with bot(certs, tmp_path, speed=20) as (core, original):
        outcome = await rerun_isolated(core, original, "U2", first_launch, on_started=started)
    assert outcome.finished.status == pb.RUN_STATUS_CANCELLED
    assert outcome.comparison["verdict"] is None and "the rerun ended cancelled" in outcome.comparison["why"]
    assert slurm.jobs() == []


async def test_an_interrupted_rerun_scancels_its_job(slurm: Slurm, certs: DevCerts, tmp_path: Path) -> None:
    placed: asyncio.Future[Placement] = asyncio.get_running_loop().create_future()

    async def started(rerun_id: str, placement: Placement) -> None:
        placed.set_result(placement)

    async with bot(certs, tmp_path, speed=5) as (core, original):
        task = asyncio.create_task(rerun_isolated(core, original, "U2", _ignore, on_started=started))
        placement = await placed
        assert slurm.jobs() == [f"{placement.handle} RUNNING"]
        task.cancel()  # what Ctrl-C does to `k3repro rerun`
        with pytest.raises(asyncio.CancelledError):
            await task
        rows = await core.store.call(Store.runs, 10)
    assert slurm.jobs() == []
    assert {row.status for row in rows if row.rerun_of} == {"cancelled"}


async def test_a_rerun_left_by_a_bot_that_died_is_released_and_judged_by_the_next_one(
    slurm: Slurm, certs: DevCerts, tmp_path: Path
) -> None:
    async with bot(certs, tmp_path, speed=100) as (core, original):
        placed = await rerun_left_running(core, original)  # the bot dies mid-rerun
        assert slurm.jobs() == [f"{placed.placement.handle} RUNNING"]
        assert await resume_runs(Coordinator(core.config, core.store))  # the next bot, on the same store
        rerun = await core.store.call(Store.get_rerun, placed.run_id)
        run = await core.store.call(Store.get_run, placed.run_id)
    assert slurm.jobs() == []
    assert (run.status, rerun.verdict, rerun.handle) == (
        "completed",
        "not_reproduced",
        placed.placement.handle,
    )


async def test_a_job_that_never_starts_is_reported_after_the_queue_wait(
    slurm: Slurm, certs: DevCerts, tmp_path: Path
) -> None:
    async with bot(certs, tmp_path, partition=DOWN, queue_wait_s=2) as (core, original):
        with pytest.raises(Refused) as caught:
            await rerun_isolated(core, original, "U2", _ignore)
        reruns = await core.store.call(Store.reruns_of, original)
    message = str(caught.value)
    assert "did not start within 2 s (PENDING: PartitionDown); it was cancelled; nothing was run" in message
    assert message.startswith("slurm job ") and "\n" not in message
    assert slurm.jobs() == [] and reruns == []


async def _ignore(event: pb.RunEvent) -> None:
    """The store keeps the events; these tests read the outcome."""
