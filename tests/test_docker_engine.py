"""The docker engine backend against a real dockerd, with a locally built image whose `vllm` is vllm-sim."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from bot.config import ClientTls
from bot.coordinator import Coordinator
from bot.runner_client import open_channel
from bot.store import AsyncStore
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from runner.engines.docker import RUN_LABEL
from runner.ports import free_port
from tests.dockerd import BUSYBOX, Dockerd
from tests.k3fixtures import bot_config, run_to_end, runner_data, running_runner
from tests.registry import running_registry

ROOT = Path(__file__).resolve().parent.parent
SIM_IMAGE = "k3repro/vllm-sim:test"
# The image is busybox plus a `vllm` that execs vllm-sim with this machine's Python, mounted read-only.
VLLM = '#!/bin/sh\n[ "$1" = serve ] && shift\nexec "$K3REPRO_SIM_PYTHON" -m vllm_sim serve "$@"\n'


@pytest.fixture(scope="module")
def sim_image(dockerd: Dockerd) -> str:
    _import_sim_image(dockerd, SIM_IMAGE)
    return SIM_IMAGE


def _import_sim_image(dockerd: Dockerd, ref: str, *labels: str) -> None:
    """busybox plus vllm-sim as its `vllm`, imported as `ref` (labels make another image of the same files)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(str(BUSYBOX), "bin/busybox")
        for name, target in (("bin/sh", "busybox"), ("bin/vllm", None)):
            info = tarfile.TarInfo(name)
            if target:
                info.type, info.linkname = tarfile.SYMTYPE, target
                tar.addfile(info)
            else:
                data = VLLM.encode()
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
    repository, tag = ref.split(":")
    changes = ['ENTRYPOINT ["vllm", "serve"]', *(f"LABEL {label}" for label in labels)]
    dockerd.client.api.import_image_from_data(buffer.getvalue(), repository=repository, tag=tag, changes=changes)


def _docker_engine(scenario: str, *, gpus: bool) -> dict[str, Any]:
    mounts = {"/usr", "/lib", "/lib64", sys.prefix, sys.base_prefix, str(ROOT)}
    return {
        "backend": "docker",
        "stall_timeout_s": 30,
        "ready_timeout_s": 60,
        "stop_grace_s": 2,
        "failure_attempts": 1,
        "docker": {
            "gpus": gpus,
            "volumes": [f"{path}:{path}:ro" for path in sorted(mounts)],
            "env": {
                "K3REPRO_SIM_PYTHON": sys.executable,
                "VLLM_SIM_SCENARIO": str(ROOT / "vllm_sim/data/scenarios" / f"{scenario}.toml"),
                "VLLM_SIM_SPEED": "500",
            },
        },
    }


def _labelled(dockerd: Dockerd) -> list[Any]:
    return [c for c in dockerd.containers() if RUN_LABEL in c.labels]


async def _run(certs: DevCerts, tmp_path: Path, engine: dict[str, Any]) -> list[pb.RunEvent]:
    data = runner_data(certs, tmp_path / "runner", allowed_images=["k3repro/vllm-sim:*"], engine=engine)
    return await run_to_end(certs, tmp_path, data, image=SIM_IMAGE)


async def test_the_method_runs_in_containers_and_leaves_none(
    docker_env: Dockerd, sim_image: str, certs: DevCerts, tmp_path: Path
) -> None:
    events = await _run(certs, tmp_path, _docker_engine("healthy", gpus=False))
    stages = {e.stage_finished.stage: e.stage_finished.status for e in events if e.HasField("stage_finished")}
    assert stages[pb.STAGE_MINIMAL_LAUNCH] == pb.STAGE_STATUS_OK
    assert stages[pb.STAGE_SINGLE_REQUEST] == pb.STAGE_STATUS_OK
    assert stages[pb.STAGE_LADDER] == pb.STAGE_STATUS_OK
    prefix = next(e.ladder_step for e in events if e.ladder_step.step == "prefix_caching")
    assert prefix.outcome == pb.LADDER_OUTCOME_CACHE_HIT
    assert events[-1].run_finished.launches >= 2
    assert _labelled(docker_env) == []  # every container of every launch was removed


async def test_gpus_without_the_nvidia_runtime_is_a_container_init_failure(
    docker_env: Dockerd, sim_image: str, certs: DevCerts, tmp_path: Path
) -> None:
    events = await _run(certs, tmp_path, _docker_engine("healthy", gpus=True))
    first = next(e.first_error for e in events if e.HasField("first_error"))
    assert first.phase == pb.PHASE_CONTAINER_INIT
    assert "could not select device driver" in first.line  # the engine's own words
    assert first.line.startswith("docker: Error response from daemon:")
    assert _labelled(docker_env) == []


def _runner_toml(certs: DevCerts, tmp_path: Path, port: int) -> Path:
    """runner.toml for a `k3repro-runner serve` process with the docker backend and a slow engine."""
    engine = _docker_engine("healthy", gpus=False)
    engine["docker"]["env"]["VLLM_SIM_SPEED"] = "2"
    lines = [
        'name = "gpu-d"', 'cluster = "cluster-a"', f'listen = "127.0.0.1:{port}"', f'state_dir = "{tmp_path / "state"}"',
        'allowed_images = ["k3repro/vllm-sim:*"]',
        f'[tls]\ncert = "{certs.runner_cert}"\nkey = "{certs.runner_key}"\nclient_ca = "{certs.ca}"',
        '[engine]\nbackend = "docker"\nstop_grace_s = 2',
        '[engine.docker]\ngpus = false\nvolumes = [' + ", ".join(f'"{v}"' for v in engine["docker"]["volumes"]) + "]",
        "[engine.docker.env]\n" + "\n".join(f'{k} = "{v}"' for k, v in engine["docker"]["env"].items()),
    ]  # fmt: skip
    path = tmp_path / "runner.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _serve(config: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [Path(sys.executable).parent / "k3repro-runner", "serve", "--config", config],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip


async def _until(predicate: Any, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return bool(predicate())


async def test_a_killed_runner_leaves_no_container_after_restart(
    docker_env: Dockerd, sim_image: str, certs: DevCerts, tmp_path: Path
) -> None:
    """The runner dies mid-run (SIGKILL: no clean-up); the next runner process removes the orphan container."""
    port = free_port("127.0.0.1")
    config = _runner_toml(certs, tmp_path, port)
    env = {**os.environ, "DOCKER_HOST": docker_env.url}
    first = _serve(config, env)
    try:
        tls = ClientTls(ca=certs.ca, cert=certs.bot_cert, key=certs.bot_key)
        async with open_channel(f"127.0.0.1:{port}", tls) as channel:
            stub = pb_grpc.RunnerStub(channel)
            request = pb.StartRunRequest(
                run_id="r-orphan", cluster="cluster-a", image=SIM_IMAGE, launch_argv=["vllm", "serve", "org/model"]
            )
            events = stub.StartRun(request, timeout=60, wait_for_ready=True)
            async for event in events:
                if event.HasField("stage_started") and event.stage_started.stage == pb.STAGE_MINIMAL_LAUNCH:
                    break
            assert await _until(lambda: _labelled(docker_env))
            first.kill()
            first.wait(timeout=10)
            events.cancel()
        assert [c.labels[RUN_LABEL] for c in _labelled(docker_env)] == ["r-orphan"]  # SIGKILL cleaned nothing
        second = _serve(config, env)
        try:
            assert await _until(lambda: not _labelled(docker_env))
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=20)
    finally:
        if first.poll() is None:
            first.kill()


async def test_cancel_removes_the_container(
    docker_env: Dockerd, sim_image: str, certs: DevCerts, tmp_path: Path
) -> None:
    engine = _docker_engine("healthy", gpus=False)
    engine["docker"]["env"]["VLLM_SIM_SPEED"] = "2"
    data = runner_data(certs, tmp_path / "runner", allowed_images=["k3repro/vllm-sim:*"], engine=engine)
    async with running_runner(data) as daemon:
        daemon.hub.start(
            pb.StartRunRequest(
                run_id="r-cancel", cluster="cluster-a", image=SIM_IMAGE, launch_argv=["vllm", "serve", "org/model"]
            )
        )
        deadline = time.monotonic() + 30
        while not _labelled(docker_env) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert len(_labelled(docker_env)) == 1
        assert await daemon.hub.cancel("r-cancel", "test")
        assert _labelled(docker_env) == []
        last = list(daemon.journal.events("r-cancel", 0))[-1]
    assert last.run_finished.status == pb.RUN_STATUS_CANCELLED


async def _ignore(event: pb.RunEvent) -> None:
    return None


async def test_an_image_tag_that_moves_between_launches_makes_the_run_isolate(
    docker_env: Dockerd, sim_image: str, certs: DevCerts, tmp_path: Path
) -> None:
    moving = "k3repro/vllm-sim:moving"
    docker_env.client.images.get(sim_image).tag(moving)
    before = docker_env.client.images.get(moving).id
    engine = {**_docker_engine("demo", gpus=False), "failure_attempts": 2}
    data = runner_data(certs, tmp_path / "runner", allowed_images=["k3repro/vllm-sim:*"], engine=engine)
    async with running_runner(data) as daemon:
        backend = daemon.hub.backend
        launch, launches = backend.launch, []

        async def repush_before_the_second_launch(*args: Any, **kwargs: Any) -> Any:
            """Someone pushes a new build under the tag between two launches (not racing the runner's relaunch)."""
            launches.append(args)
            if len(launches) == 2:
                await asyncio.to_thread(_import_sim_image, docker_env, moving, "build=2")
            return await launch(*args, **kwargs)

        backend.launch = repush_before_the_second_launch  # type: ignore[method-assign]
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"], image=moving)
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        finished = await core.follow(await core.start("cluster-a", "U1"), _ignore)
        store.close()
    after = docker_env.client.images.get(moving).id
    assert len(launches) >= 2 and after != before and finished.decision == pb.DECISION_ISOLATE
    moved_reason = next(r for r in finished.reasons if "moved during the run" in r)
    assert moved_reason.startswith(f"image {moving} moved during the run ({before[7:19]} → {after[7:19]})")
    assert _labelled(docker_env) == []


async def test_a_tag_with_a_registry_digest_runs_by_it_so_a_moved_tag_changes_nothing(
    docker_env: Dockerd, sim_image: str, certs: DevCerts, tmp_path: Path
) -> None:
    """Pulled from a registry, the tag has a registry digest: freeze pins it, every launch runs that digest (the
    tag moving mid-run changes nothing), and image_pinned passes naming it. The same push as the test above."""
    with running_registry() as registry:
        digest = registry.publish(docker_env.client, sim_image, "k3repro/vllm-sim", "pinned")
        repository = f"{registry.host}/k3repro/vllm-sim"
        docker_env.client.images.pull(repository, tag="pinned")
    tag = f"{repository}:pinned"
    before = docker_env.client.images.get(tag).id
    assert docker_env.client.images.get(tag).attrs["RepoDigests"] == [f"{repository}@{digest}"]
    _import_sim_image(docker_env, "k3repro/vllm-sim:build2", "build=2")
    engine = {**_docker_engine("demo", gpus=False), "failure_attempts": 2}
    data = runner_data(certs, tmp_path / "runner", allowed_images=[f"{repository}:*"], engine=engine)
    events: list[pb.RunEvent] = []

    async def record(event: pb.RunEvent) -> None:
        events.append(event)

    async with running_runner(data) as daemon:
        backend = daemon.hub.backend
        launch, launches = backend.launch, []

        async def retag_before_the_second_launch(*args: Any, **kwargs: Any) -> Any:
            launches.append(args)
            if len(launches) == 2:
                build2 = docker_env.client.images.get("k3repro/vllm-sim:build2")
                await asyncio.to_thread(build2.tag, repository, "pinned")
            return await launch(*args, **kwargs)

        backend.launch = retag_before_the_second_launch  # type: ignore[method-assign]
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"], image=tag)
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        finished = await core.follow(await core.start("cluster-a", "U1"), record)
        store.close()
    assert len(launches) >= 2 and docker_env.client.images.get(tag).id != before
    assert finished.launches >= 2 and not [r for r in finished.reasons if "moved during the run" in r]
    report = json.loads(next(e.artifact.content for e in events if e.artifact.name == "baseline"))
    pinned = next(r for r in report["rules"] if r["id"] == "image_pinned")
    assert pinned["status"] == "pass" and pinned["message"] == f"tag pinned by freeze to {digest}"
    fingerprint = json.loads(next(e.artifact.content for e in events if e.artifact.name == "fingerprint"))
    assert fingerprint["image"]["pinned_ref"] == f"{repository}@{digest}"
    assert _labelled(docker_env) == []
