"""Isolated reruns through the `static` provider: the three verdicts on simulated hosts that differ, and
every refusal with one line and nothing changed."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from bot import rerun as rerun_module
from bot.bundle import Bundle
from bot.coordinator import Coordinator
from bot.record import image_digest
from bot.refusal import Refused
from bot.rerun import rerun_isolated, rerun_request, verdict_lines
from bot.runner_client import open_channel
from bot.store import AsyncStore, RunNotFound, Store
from kernel.tls import DevCerts
from kernel.toml_reader import ConfigError
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from tests.k3fixtures import SIM_SPEED, bot_config, runner_data, running_runner

DIGEST_IMAGES = ["vllm/vllm-openai:*", "vllm/vllm-openai@sha256:*"]


@dataclass
class Site:
    core: Coordinator
    store: AsyncStore
    isolated: str  # the isolated runner's address


@contextlib.asynccontextmanager
async def site(
    certs: DevCerts,
    tmp_path: Path,
    original: str,
    isolated: str,
    isolated_images: list[str] = DIGEST_IMAGES,
    **isolation: Any,
) -> AsyncIterator[Site]:
    """A cluster with one regular runner on the `original` host and one runner labelled isolated on another."""
    regular = runner_data(certs, tmp_path / "regular", scenario=original, speed=SIM_SPEED)
    other = runner_data(
        certs,
        tmp_path / "isolated",
        scenario=isolated,
        speed=SIM_SPEED,
        name="gpu-isolated",
        labels=["isolated"],
        allowed_images=isolated_images,
    )
    async with running_runner(regular) as a, running_runner(other) as b:
        runners = [f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]
        config = bot_config(certs, tmp_path / "k3.db", runners, isolation={"provider": "static", **isolation})
        store = AsyncStore(config.store)
        try:
            yield Site(Coordinator(config, store), store, runners[1])
        finally:
            store.close()


async def _original(s: Site) -> str:
    async def ignore(event: pb.RunEvent) -> None:
        pass

    started = await s.core.start("cluster-a", "U1")
    await s.core.follow(started, ignore)
    return started.run_id


async def test_a_secondary_oom_on_the_original_host_is_not_reproduced_on_a_clean_one(
    certs: DevCerts, tmp_path: Path
) -> None:
    async with site(certs, tmp_path, "leftover-process", "healthy") as s:
        original = await _original(s)
        outcome = await rerun_isolated(s.core, original, "U2", _ignore)
        rerun_row = await s.store.call(Store.get_run, outcome.run_id)
        link = await s.store.call(Store.reruns_of, original)
    c = outcome.comparison
    assert c["verdict"] == "not_reproduced" and "suspect the environment" in c["why"]
    assert c["original"]["phase"] == "gpu_detect" and c["original"]["category"] == "oom" and c["rerun"] is None
    foreign = {d["path"]: (d["a"], d["b"]) for d in c["differences"]}
    assert foreign["nvml.processes (foreign GPU memory)"] == (
        "1 process(es) holding 327680 MiB on 8 GPU slot(s)",
        "none",
    )
    assert outcome.placement.address == s.isolated and outcome.finished.status == pb.RUN_STATUS_COMPLETED
    assert rerun_row.rerun_of == original and rerun_row.runner == s.isolated
    assert rerun_row.status == "completed" and rerun_row.image == "vllm/vllm-openai:kimi-k3"
    assert [(r.run_id, r.verdict, r.provider) for r in link] == [(outcome.run_id, "not_reproduced", "static")]
    text = "\n".join(verdict_lines(outcome))
    assert "not_reproduced" in text and "foreign GPU memory" in text and "original: gpu_detect [oom]" in text


async def test_the_same_nccl_failure_on_the_isolated_node_is_reproduced(certs: DevCerts, tmp_path: Path) -> None:
    async with site(certs, tmp_path, "demo", "demo") as s:
        original = await _original(s)
        outcome = await rerun_isolated(s.core, original, "U2", _ignore)
    c = outcome.comparison
    assert c["verdict"] == "reproduced" and c["differences"] == []
    assert c["original"]["signature"] == c["rerun"]["signature"] and c["rerun"]["phase"] == "gpu_detect"
    assert c["rerun"]["category"] == "nccl_comm"


async def test_a_rerun_starts_over_one_stream_and_shows_each_event_once(certs: DevCerts, tmp_path: Path) -> None:
    seen: list[int] = []

    async def show(event: pb.RunEvent) -> None:
        seen.append(event.seq)

    async with site(certs, tmp_path, "demo", "demo") as s:
        original = await _original(s)
        outcome = await rerun_isolated(s.core, original, "U2", show)
        stored = [e.seq for e in await s.store.call(Store.events, outcome.run_id)]
    assert seen == stored and seen == sorted(set(seen)) and seen[0] == 1  # the first event too, once, in order
    assert outcome.finished.status == pb.RUN_STATUS_COMPLETED


async def test_a_rerun_its_runner_refuses_is_recorded_as_an_error(certs: DevCerts, tmp_path: Path) -> None:
    async with site(certs, tmp_path, "demo", "demo", isolated_images=["registry.local/other:*"]) as s:
        original = await _original(s)
        with pytest.raises(Refused) as refused:
            await rerun_isolated(s.core, original, "U2", _ignore)
        (link,) = await s.store.call(Store.reruns_of, original)
        row = await s.store.call(Store.get_run, link.run_id)
        events = await s.store.call(Store.events, link.run_id)
    said = str(refused.value)
    assert "\n" not in said and f"runner {s.isolated} refused the run" in said and "not allowlisted" in said
    assert row.status == "error" and row.summary == said and events == []


async def test_another_failure_first_on_the_isolated_node_is_a_different_failure(
    certs: DevCerts, tmp_path: Path
) -> None:
    async with site(certs, tmp_path, "prefix-cache-crash", "old-driver") as s:
        original = await _original(s)
        outcome = await rerun_isolated(s.core, original, "U2", _ignore)
    c = outcome.comparison
    assert c["verdict"] == "different_failure" and "new candidate" in c["why"]
    assert c["original"]["phase"] == "request" and "illegal memory access" in c["original"]["line"]
    assert c["rerun"]["phase"] == "baseline" and "driver r550 is older than r580" in c["rerun"]["signature"]
    changed = {d["path"]: (d["a"], d["b"]) for d in c["differences"]}
    assert changed["nvml.driver_version"] == ("580.65.06", "550.54.15")
    assert changed["nvml.cuda_driver_version"] == ("13.0", "12.4")


async def test_refusals_are_one_line_and_change_nothing(
    certs: DevCerts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with site(certs, tmp_path, "demo", "healthy", label="gpu-isolated-pool") as s:
        original = await _original(s)
        before = await s.store.call(Store.runs, 100)
        with pytest.raises(RunNotFound, match="no run 'nope'"):
            await rerun_isolated(s.core, "nope", "U2", _ignore)
        with pytest.raises(Refused) as no_runner:
            await rerun_isolated(s.core, original, "U2", _ignore)
        monkeypatch.setattr(rerun_module, "MAX_BUNDLE_BYTES", 1000)
        with pytest.raises(Refused) as oversized:
            await rerun_isolated(s.core, original, "U2", _ignore)
        after = await s.store.call(Store.runs, 100)
        reruns = await s.store.call(Store.reruns_of, original)
    assert "no isolated runner" in str(no_runner.value) and "lacks label(s) gpu-isolated-pool" in str(no_runner.value)
    assert str(no_runner.value).endswith("; nothing was run")
    assert "over the limit of 1000 bytes; nothing was started" in str(oversized.value)
    assert all("\n" not in str(e.value) for e in (no_runner, oversized))
    assert after == before and reruns == []


async def test_without_an_isolation_provider_nothing_starts(certs: DevCerts, tmp_path: Path) -> None:
    async with running_runner(runner_data(certs, tmp_path / "r", scenario="demo", speed=SIM_SPEED)) as daemon:
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        original = await _original(Site(core, store, ""))
        with pytest.raises(Refused) as caught:
            await rerun_isolated(core, original, "U2", _ignore)
        runs = await store.call(Store.runs, 100)
        store.close()
    assert str(caught.value) == (
        "no isolation provider is configured for cluster cluster-a ([isolation] in the bot's config); "
        "nothing was started"
    )
    assert [r.id for r in runs] == [original]


def _bundle(digest_ref: str | None) -> Bundle:
    scene = {"image": {"ref": "vllm/vllm-openai:kimi-k3", "repo_digests": [digest_ref] if digest_ref else []}}
    members = {
        "run.json": json.dumps({"id": "orig-1"}).encode(),
        "fingerprint.json": json.dumps(scene).encode(),
        "launch.json": json.dumps(
            {
                "cluster": "cluster-a",
                "image": "vllm/vllm-openai:kimi-k3",
                "image_digest": image_digest(scene),
                "argv": ["vllm", "serve", "m"],
                "profile": "kimi-k3",
            }
        ).encode(),
        "request.json": json.dumps({"api": "chat", "body_json": "", "repeats": 3}).encode(),
    }
    return Bundle({"format": 1, "members": {}}, members)


def test_a_rerun_runs_the_image_by_the_digest_the_scene_pinned() -> None:
    pinned = rerun_request(_bundle("vllm/vllm-openai@sha256:" + "cd" * 32), "r2", "U2")
    assert pinned.image == "vllm/vllm-openai@sha256:" + "cd" * 32
    assert pinned.rerun.image_digest == "sha256:" + "cd" * 32 and pinned.rerun.original_run_id == "orig-1"
    by_tag = rerun_request(_bundle(None), "r3", "U2")
    assert by_tag.image == "vllm/vllm-openai:kimi-k3" and by_tag.rerun.image_digest == ""


async def test_the_runner_refuses_a_rerun_by_tag_when_the_bundle_has_a_digest(certs: DevCerts, tmp_path: Path) -> None:
    data = runner_data(certs, tmp_path / "r", scenario="healthy", speed=SIM_SPEED, allowed_images=DIGEST_IMAGES)
    config = bot_config(certs, tmp_path / "k3.db", ["127.0.0.1:1"])
    request = rerun_request(_bundle("vllm/vllm-openai@sha256:" + "cd" * 32), "r4", "U2")
    request.image = "vllm/vllm-openai:kimi-k3"
    async with running_runner(data) as daemon, open_channel(f"127.0.0.1:{daemon.port}", config.tls) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in pb_grpc.RunnerStub(channel).StartRun(request):
                pass
        assert daemon.journal.request("r4") is None
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is not the bundle's digest sha256:cdcd" in (caught.value.details() or "")


async def _ignore(event: pb.RunEvent) -> None:
    """The events go to the store; these tests read the comparison."""


async def test_a_once_runner_serves_one_run_then_refuses_more(certs: DevCerts, tmp_path: Path) -> None:
    data = runner_data(certs, tmp_path / "r", scenario="demo", speed=SIM_SPEED)  # not labelled: a regular start
    async with running_runner(data) as daemon:
        daemon.hub.once = True
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"])
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        first = await _original(Site(core, store, ""))
        assert daemon.hub.served.is_set()
        assert (await store.call(Store.get_run, first)).status == "completed"
        with pytest.raises(Refused, match=r"resource_exhausted: runner gpu-test serves one run only \(--once\)"):
            await core.start("cluster-a", "U1")
        store.close()


@pytest.mark.parametrize(
    ("isolation", "expected"),
    [
        ({"provider": "lsf"}, "[isolation]: provider 'lsf' is not one of static, slurm, kubernetes"),
        ({"provider": "slurm", "script": "x.sbatch"}, "[isolation]: provider slurm needs runner_config, work_dir"),
        ({"provider": "kubernetes", "api_url": "https://k"}, "provider kubernetes needs job_template, image"),
        ({"provider": "kubernetes", "tolerations": ["NoSchedule"]}, "'tolerations' must be a list of tables"),
    ],
)
def test_a_bad_isolation_section_is_one_clear_config_error(
    tmp_path: Path, isolation: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        bot_config(None, tmp_path / "k3.db", ["127.0.0.1:1"], isolation=isolation)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_a_cluster_s_own_isolation_section_overrides_the_global_one(tmp_path: Path) -> None:
    config = bot_config(None, tmp_path / "k3.db", ["127.0.0.1:1"], isolation={"provider": "static", "label": "iso"})
    assert config.clusters["cluster-a"].isolation is not None
    assert config.clusters["cluster-a"].isolation.label == "iso"
    data = {"provider": "slurm", "script": "s.sbatch", "runner_config": "r.toml", "work_dir": "jobs", "partition": "p"}
    cluster = {**_cluster_table(), "isolation": data}
    config = bot_config(None, tmp_path / "k3.db", ["127.0.0.1:1"], clusters={"cluster-a": cluster})
    own = config.clusters["cluster-a"].isolation
    assert own is not None and own.provider == "slurm" and own.script == tmp_path / "s.sbatch"
    assert own.partition == "p" and own.queue_wait_s == 600


def _cluster_table() -> dict[str, Any]:
    return {"runners": ["127.0.0.1:1"], "image": "vllm/vllm-openai:kimi-k3", "launch": "vllm serve m"}
