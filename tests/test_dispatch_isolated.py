"""A runner kept for isolated reruns (labelled `isolated`, or the cluster's `[isolation] label`) never takes a
regular run, even when every other runner of the cluster is down or busy: the start is refused in one line that
says why for each runner, and nothing is stored but the refusal."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.coordinator import Coordinator
from bot.dispatcher import pick_runner
from bot.refusal import Refused
from bot.store import AsyncStore, Store
from kernel.tls import DevCerts
from tests.k3fixtures import bot_config, runner_data, running_runner

DEAD = "127.0.0.1:9"  # nothing listens on the discard port


@contextlib.asynccontextmanager
async def _core(
    certs: DevCerts, tmp_path: Path, store: str, runners: list[str], **bot: Any
) -> AsyncIterator[Coordinator]:
    config = bot_config(certs, tmp_path / store, runners, **bot)
    store = AsyncStore(config.store)
    try:
        yield Coordinator(config, store)
    finally:
        store.close()


async def test_a_start_never_runs_on_the_isolated_runner_when_the_regular_one_is_down(
    certs: DevCerts, tmp_path: Path
) -> None:
    isolated = runner_data(certs, tmp_path / "iso", scenario="healthy", name="iso-1", labels=["isolated"])
    async with running_runner(isolated) as daemon:
        address = f"127.0.0.1:{daemon.port}"
        async with _core(certs, tmp_path, "k3.db", [DEAD, address], isolation={"provider": "static"}) as core:
            with pytest.raises(Refused) as refused:
                await core.start("cluster-a", "U1")
            runs = await core.store.call(Store.runs, 10)
            audit = await core.store.call(Store.audit_entries, 10)
            placed = await pick_runner(core.config, core.config.cluster("cluster-a"), labels=("isolated",))
        assert not daemon.hub.active
    said = str(refused.value)
    assert "\n" not in said
    assert said.startswith(f"no runner of cluster cluster-a can take the run: {DEAD} unreachable (")
    assert said.endswith(f"; iso-1 ({address}) isolated: only for isolated reruns")
    assert runs == [] and audit == []
    assert placed.address == address  # an isolated rerun still gets it


async def test_a_busy_regular_runner_does_not_spill_over_to_the_isolated_one(certs: DevCerts, tmp_path: Path) -> None:
    # the regular runner's run hangs in start-up (it stays busy); the isolated runner is idle
    regular = runner_data(certs, tmp_path / "regular", scenario="nccl-init-hang", speed=1, name="gpu-1")
    isolated = runner_data(certs, tmp_path / "iso", scenario="healthy", name="iso-1", labels=["gpu-isolated-pool"])
    async with running_runner(regular) as a, running_runner(isolated) as b:
        runners = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
        isolation = {"provider": "static", "label": "gpu-isolated-pool"}
        async with _core(certs, tmp_path, "one.db", runners, isolation=isolation) as one:
            first = await one.start("cluster-a", "U1")
            async with _core(certs, tmp_path, "two.db", runners, isolation=isolation) as two:  # another bot
                with pytest.raises(Refused) as refused:
                    await two.start("cluster-a", "U2")
        assert first.runner == runners[0] and not b.hub.active
    said = str(refused.value)
    assert f"gpu-1 busy with run {first.run_id}" in said
    assert said.endswith(f"; iso-1 ({runners[1]}) gpu-isolated-pool: only for isolated reruns")


async def test_the_isolated_label_reserves_a_runner_whatever_the_provider(certs: DevCerts, tmp_path: Path) -> None:
    isolated = runner_data(certs, tmp_path / "iso", scenario="healthy", name="iso-1", labels=["isolated"])
    async with running_runner(isolated) as daemon:
        address = f"127.0.0.1:{daemon.port}"
        async with _core(certs, tmp_path, "k3.db", [address]) as core:  # no [isolation] at all
            with pytest.raises(Refused, match=rf"iso-1 \({address}\) isolated: only for isolated reruns$"):
                await core.start("cluster-a", "U1")
