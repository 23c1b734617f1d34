"""Fingerprints of images on a real Docker engine (started by the tests, see tests/dockerd.py)."""

from __future__ import annotations

import json
from typing import Any

import docker
import pytest

from bot.cli import main
from kernel.baseline import load_baseline
from kernel.fingerprint import diff, to_text
from kernel.vllm_cli import parse_launch_command
from protos import runner_pb2 as pb
from runner.config import parse_runner_config
from runner.engines.process import ProcessBackend
from runner.fingerprint import ImageTarget, collect
from runner.fingerprint.image import PROBE_LABEL, probe_options
from runner.nvml import PynvmlSource
from runner.stages import baseline, freeze
from runner.stages.context import RunContext
from tests.dockerd import SECRET_IN_IMAGE, Dockerd
from tests.k3fixtures import runner_data
from tests.test_fingerprint import FakeNvml


def image_scene(ref: str) -> dict[str, Any]:
    return collect(PynvmlSource(), ImageTarget(ref))  # this host has no NVML: no GPU request


def probe_containers(engine: Dockerd) -> list[Any]:
    return [c for c in engine.containers() if PROBE_LABEL in (c.labels or {})]


def test_image_inspect_and_probe_report_what_loads_inside(docker_env: Dockerd) -> None:
    scene = image_scene("vllm/vllm-openai:kimi-k3")
    image, runtime = scene["image"], scene["runtime"]
    assert image["ref"] == "vllm/vllm-openai:kimi-k3" and image["id"].startswith("sha256:")
    assert image["repo_digests"] == [] and image["pinned"] is False  # imported locally: no registry digest
    assert image["env"]["CUDA_VERSION"] == "13.0.1"
    assert image["env"]["NVIDIA_REQUIRE_CUDA"] == "cuda>=13.0 brand=tesla,driver>=535,driver<536"
    assert image["labels"] == {"maintainer": "vLLM", "org.opencontainers.image.version": "0.33.0"}
    assert {k: runtime[k] for k in ("source", "python", "vllm", "torch", "torch_cuda", "cuda_runtime", "nccl")} == {
        "source": "image",
        "python": None,  # the image has no Python: the probe read the usual dist-packages directly
        "vllm": "0.33.0",
        "torch": "2.14.0",
        "torch_cuda": "13.0",
        "cuda_runtime": "13.0.1",
        "nccl": "2.28.3",
    }
    assert runtime["cuda_runtime_source"] == "/usr/local/cuda/version.json" and runtime["error"] is None
    assert runtime["cuda_compat"] == {
        "dirs": ["/usr/local/cuda-13.0/compat"],
        "driver": "580.65.06",
        "loaded": False,
        "via": [],
    }
    smi = runtime["container_nvidia_smi"]
    assert (smi["available"], smi["driver_version"], smi["cuda_version"], smi["gpu_count"]) == (
        True,
        "580.65.06",
        "13.0",
        8,
    )
    assert probe_containers(docker_env) == []  # the short-lived container is gone


def test_secrets_in_the_image_env_are_redacted(docker_env: Dockerd) -> None:
    scene = image_scene("vllm/vllm-openai:kimi-k3")
    assert SECRET_IN_IMAGE not in to_text(scene)
    assert scene["image"]["env"]["HF_TOKEN"].startswith("[REDACTED:")


@pytest.mark.parametrize(
    ("ref", "verdict", "failing"),
    [
        ("vllm/vllm-openai:kimi-k3", "warn", {"image_pinned": "warn"}),
        ("vllm/vllm-openai:v0.33.0-cu132", "fail", {"cuda_runtime_within_driver": "fail", "image_pinned": "warn"}),
        ("vllm/vllm-openai:v0.19.0-cu129", "fail", {"image_cuda13_build": "fail", "image_pinned": "warn"}),
        ("vllm/vllm-openai:kimi-k3-compat", "warn", {"compat_libs_needed": "warn", "image_pinned": "warn"}),
    ],
)
def test_kimi_k3_baseline_on_real_images(docker_env: Dockerd, ref: str, verdict: str, failing: dict[str, str]) -> None:
    report = load_baseline("kimi-k3").evaluate(image_scene(ref))
    assert report["verdict"] == verdict
    assert {r["id"]: r["status"] for r in report["rules"] if r["status"] != "pass"} == failing


def test_an_image_without_a_shell_or_not_on_the_host_is_reported(docker_env: Dockerd) -> None:
    no_shell = image_scene("vllm/vllm-openai:no-shell")
    assert no_shell["image"]["id"] and no_shell["runtime"]["vllm"] is None
    assert "probe container failed" in no_shell["runtime"]["error"] and "/bin/sh" in no_shell["runtime"]["error"]
    missing = image_scene("vllm/vllm-openai:not-pulled")
    assert missing["image"]["id"] is None and missing["image"]["error"] == (
        "image vllm/vllm-openai:not-pulled is not on this host (not pulled)"
    )
    assert "not-pulled" not in str(docker_env.client.images.list())  # freeze never pulls
    assert probe_containers(docker_env) == []


def test_the_probe_asks_for_the_launch_gpu_request_only_when_the_host_has_gpus(docker_env: Dockerd) -> None:
    with_gpus, without = probe_options(gpus=True), probe_options(gpus=False)
    request = with_gpus["device_requests"][0]
    assert (request["Count"], request["Capabilities"]) == (-1, [["gpu"]])
    assert "device_requests" not in without and with_gpus["network_mode"] == without["network_mode"] == "none"
    # NVML says GPUs, but this engine has no NVIDIA runtime: its refusal is recorded, not raised
    scene = collect(FakeNvml(), ImageTarget("vllm/vllm-openai:kimi-k3"))
    assert 'could not select device driver "" with capabilities: [[gpu]]' in scene["runtime"]["error"]
    assert scene["image"]["id"] and probe_containers(docker_env) == []


def test_no_docker_engine_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    scene = image_scene("vllm/vllm-openai:kimi-k3")
    assert scene["image"]["id"] is None and scene["image"]["error"].startswith("docker engine unreachable")
    assert scene["runtime"]["error"] == scene["image"]["error"]
    report = load_baseline("kimi-k3").evaluate(scene)
    assert report["verdict"] == "warn" and {r["status"] for r in report["rules"]} == {"unknown"}


def test_cli_on_images(docker_env: Dockerd, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fingerprint", "--image", "vllm/vllm-openai:kimi-k3", "--json"]) == 0
    good = json.loads(capsys.readouterr().out)
    assert main(["fingerprint", "--image", "vllm/vllm-openai:v0.33.0-cu132", "--json"]) == 0
    newer = json.loads(capsys.readouterr().out)
    paths = {d["path"]: d["kind"] for d in diff(good, newer)["differences"]}
    assert paths["runtime.cuda_runtime"] == paths["image.env.CUDA_VERSION"] == paths["image.id"] == "matters"
    assert paths["image.created"] == "noise"
    (tmp_path / "newer.json").write_text(to_text(newer))
    assert main(["check", "--baseline", "kimi-k3", "--fingerprint", str(tmp_path / "newer.json")]) == 1
    assert "even though nvidia-smi works in the container" in capsys.readouterr().out
    assert main(["check", "--baseline", "kimi-k3", "--image", "vllm/vllm-openai:kimi-k3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "warn"


def test_the_private_engine_is_the_one_in_use(docker_env: Dockerd) -> None:
    info = docker.from_env().info()
    assert info["ID"] == docker_env.client.info()["ID"] and info["DockerRootDir"].startswith(str(docker_env.root))


class ImageBackend(ProcessBackend):
    """A backend that runs images (the docker backend's contract for freeze): probe the image itself."""

    def probe_target(self, argv: list[str], image: str) -> ImageTarget:
        return ImageTarget(image)


async def test_freeze_records_the_image_scene_and_its_checklist(docker_env: Dockerd, tmp_path: Any) -> None:
    events: list[pb.RunEvent] = []

    async def emit(**payload: Any) -> pb.RunEvent:
        events.append(pb.RunEvent(**payload))
        return events[-1]

    config = parse_runner_config(runner_data(None, tmp_path), base=tmp_path, origin="test")
    request = pb.StartRunRequest(run_id="r1", image="vllm/vllm-openai:kimi-k3", profile="kimi-k3")
    command = parse_launch_command(["vllm", "serve", "moonshotai/Kimi-K3", "--api-key", "hunter2-prod"])
    ctx = RunContext("r1", request, command, config, ImageBackend(PynvmlSource()), emit)
    result = await freeze.run(ctx)
    assert result.status == pb.STAGE_STATUS_OK
    assert "NVML unavailable" in result.summary and "loads vLLM 0.33.0, torch 2.14.0, CUDA 13.0.1" in result.summary
    checks = {e.checklist_item.item: e.checklist_item for e in events if e.HasField("checklist_item")}
    assert checks[pb.CHECKLIST_ID_HOST_DRIVER_RECORDED].state == pb.CHECKLIST_STATE_PENDING
    view = checks[pb.CHECKLIST_ID_CONTAINER_GPU_VIEW_RECORDED]
    assert view.state == pb.CHECKLIST_STATE_HOLDS and view.evidence == "nvidia-smi (image): driver 580.65.06, 8 GPU(s)"
    pinned = checks[pb.CHECKLIST_ID_IMAGE_AND_VERSIONS_PINNED]
    assert pinned.state == pb.CHECKLIST_STATE_PENDING and "has no digest" in pinned.evidence
    artifact = next(e.artifact.content for e in events if e.HasField("artifact"))
    assert "hunter2-prod" not in artifact and SECRET_IN_IMAGE not in artifact
    assert ctx.evidence.fingerprint is not None and json.loads(artifact)["sha256"] == ctx.evidence.fingerprint["sha256"]
    assert (await baseline.run(ctx)).summary.startswith("kimi-k3: warn (5 pass, 1 warn) — warn: image_pinned")
