"""The kubernetes engine backend against a local stand-in of the Kubernetes API (tests/kube_api.py): each launch
a Pod on the runner's node, created, followed through pods/log, deleted with its grace period; the stand-in's
kubelet runs the vLLM image's entrypoint as vllm-sim, and every Pod body is checked against the Kubernetes schemas."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube.codecs import from_dict

from kernel.clock import Clock
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from runner.config import parse_runner_config
from runner.engines import kubernetes as kube_engine
from runner.engines.kubernetes import GPU_RESOURCE, LAUNCH_LABEL, RUN_LABEL, KubernetesBackend, pod_manifest
from runner.journal import Journal
from tests.k3fixtures import SIM_SPEED, run_to_end, runner_data, running_runner
from tests.kube_api import NODE, TOKEN, KubeApi

STARTUP_HANG_SPEED = 2000  # as tests/test_scenarios.py: a start-up hang must be found as a stall


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    return path


def _serving(scenario: str, speed: float, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeApi]:
    """The stand-in running vllm-sim at `speed`; the runner's clock follows it, as with the sim backend."""
    monkeypatch.setattr(kube_engine, "engine_clock", lambda: Clock.scaled(speed))
    with KubeApi(scenario=scenario, speed=speed).serving() as api:
        yield api


def _engine(api: KubeApi, token: Path, **kubernetes: Any) -> dict[str, Any]:
    return {
        "backend": "kubernetes",
        "stop_grace_s": 2,
        "kubernetes": {"api_url": api.url, "token_file": str(token), "node_name": NODE, **kubernetes},
    }


def _data(tmp_path: Path, certs: DevCerts | None, api: KubeApi, token: Path, **kubernetes: Any) -> dict[str, Any]:
    return runner_data(certs, tmp_path / "runner", engine=_engine(api, token, **kubernetes))


def _stages(events: list[pb.RunEvent]) -> dict[int, int]:
    return {e.stage_finished.stage: e.stage_finished.status for e in events if e.HasField("stage_finished")}


def _deletes(api: KubeApi) -> list[str]:
    return [path for method, path in api.requests if method == "DELETE"]


async def test_the_method_runs_in_pods_on_its_node_and_leaves_none(
    certs: DevCerts, tmp_path: Path, token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for api in _serving("healthy", SIM_SPEED, monkeypatch):
        events = await run_to_end(certs, tmp_path, _data(tmp_path, certs, api, token))
        stages = _stages(events)
        assert stages[pb.STAGE_MINIMAL_LAUNCH] == pb.STAGE_STATUS_OK
        assert stages[pb.STAGE_SINGLE_REQUEST] == pb.STAGE_STATUS_OK
        assert stages[pb.STAGE_LADDER] == pb.STAGE_STATUS_OK
        finished = events[-1].run_finished
        assert finished.launches >= 2 and len(api.created) == finished.launches
        assert api.invalid == []  # every Pod body passed the Kubernetes schemas
        for body in api.created:
            spec = body["spec"]
            (container,) = spec["containers"]
            assert spec["nodeName"] == NODE and spec["restartPolicy"] == "Never" and not spec["hostNetwork"]
            assert container["image"] == "vllm/vllm-openai:kimi-k3"
            assert container["args"][:1] == ["moonshotai/Kimi-K3"]  # the image's entrypoint is `vllm serve`
            assert container["resources"]["limits"] == {GPU_RESOURCE: "8"}  # --tensor-parallel-size 8
            port = container["args"][container["args"].index("--port") + 1]
            assert container["ports"] == [{"name": "http", "containerPort": int(port), "protocol": "TCP"}]
        assert len({b["metadata"]["labels"][RUN_LABEL] for b in api.created}) == 1  # the run's id
        assert sorted(b["metadata"]["labels"][LAUNCH_LABEL] for b in api.created) == sorted(
            str(n) for n in range(1, finished.launches + 1)
        )
        assert api.pod_names() == []  # every launch's Pod was deleted, and waited for


async def test_a_failing_deployment_is_found_through_pods(
    certs: DevCerts, tmp_path: Path, token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for api in _serving("prefix-cache-crash", SIM_SPEED, monkeypatch):
        events = await run_to_end(certs, tmp_path, _data(tmp_path, certs, api, token))
        finished = events[-1].run_finished
        first = next(e.first_error for e in events if e.HasField("first_error"))
        assert (first.phase, first.category) == (pb.PHASE_REQUEST, pb.ERROR_CATEGORY_REQUEST_ERROR)
        assert "an illegal memory access was encountered" in first.line
        # the flag is found; not "fix": this host's NVML (none here) and no image probe leave the scene unsettled
        assert finished.decision == pb.DECISION_CONTINUE, finished.summary
        assert "ladder: prefix_caching triggers the failure: adds --enable-prefix-caching" in finished.summary
        assert api.invalid == [] and api.pod_names() == []


async def test_a_startup_hang_is_cut_off_and_its_pod_deleted(
    certs: DevCerts, tmp_path: Path, token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for api in _serving("nccl-init-hang", STARTUP_HANG_SPEED, monkeypatch):
        data = runner_data(certs, tmp_path / "runner", speed=STARTUP_HANG_SPEED, engine=_engine(api, token))
        events = await run_to_end(certs, tmp_path, data)
        first = next(e.first_error for e in events if e.HasField("first_error"))
        assert (first.phase, first.category) == (pb.PHASE_GPU_DETECT, pb.ERROR_CATEGORY_NCCL_COMM)
        assert "hang: no progress in gpu_detect" in first.line
        assert events[-1].run_finished.decision == pb.DECISION_CONTINUE
        deletes = _deletes(api)
        assert len(deletes) == len(api.created) >= 1  # each hung Pod deleted, with a grace period
        assert all("gracePeriodSeconds=" in path for path in deletes)
        assert api.pod_names() == []


async def test_the_pod_of_a_run_a_dead_runner_left_is_deleted_at_start_up(
    certs: DevCerts, tmp_path: Path, token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for api in _serving("healthy", 1.0, monkeypatch):
        data = _data(tmp_path, None, api, token)
        config = parse_runner_config(data, base=tmp_path, origin="test runner")
        settings = config.engine.kubernetes
        # what a runner killed mid-run leaves: its run unfinished in the journal, its engine's Pod serving
        config.state_dir.mkdir(parents=True, exist_ok=True)
        journal = Journal(config.journal_path)
        journal.add_run(pb.StartRunRequest(run_id="r-dead", cluster="cluster-a", image="vllm/vllm-openai:kimi-k3"))
        journal.close()
        argv = ["vllm", "serve", "org/model", "--host", "127.0.0.1", "--port", "1"]
        dead = await KubernetesBackend(settings).launch(argv, run_id="r-dead", image="vllm/vllm-openai:kimi-k3")
        other = pod_manifest(settings, "gpu-node-2", argv, run_id="r-dead", image="vllm/vllm-openai:kimi-k3", launch=1)
        client = KubernetesBackend(settings)._client()
        await client.create(from_dict(other))  # another node's Pod of the same run: not this runner's to delete
        await client.close()
        assert dead.returncode is None and len(api.pod_names()) == 2
        async with running_runner(data) as daemon:
            assert daemon.hub.journal.is_finished("r-dead")
            assert api.pod_names() == [other["metadata"]["name"]]
        assert api.invalid == []


async def test_a_pod_the_node_has_no_gpus_for_is_a_refused_launch_in_the_kubelets_words(
    certs: DevCerts, tmp_path: Path, token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device plugin's GPUs are the node's truth: 8 asked for, 4 there, so the kubelet rejects the Pod."""
    monkeypatch.setattr(kube_engine, "engine_clock", lambda: Clock.scaled(SIM_SPEED))
    with KubeApi(speed=SIM_SPEED, gpus=4).serving() as api:
        events = await run_to_end(certs, tmp_path, _data(tmp_path, certs, api, token))
        summary = events[-1].run_finished.summary
        assert "engine exited with code 125 before the API answered; last line: kubernetes: pod k3repro-" in summary
        assert "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 8" in summary
        assert _stages(events)[pb.STAGE_MINIMAL_LAUNCH] != pb.STAGE_STATUS_OK
        assert api.pod_names() == [] and api.invalid == []


async def test_on_the_host_network_the_engine_is_probed_at_the_launch_host(tmp_path: Path, token: Path) -> None:
    """host_network = true: the Pod shares the node's network (the DaemonSet's runner is on it too), so the engine
    has no address of its own and the launcher probes launch_host; the Pod declares no containerPort."""
    with KubeApi(speed=1000).serving() as api:
        settings = parse_runner_config(
            _data(tmp_path, None, api, token, host_network=True), base=tmp_path, origin="test runner"
        ).engine.kubernetes
        argv = ["vllm", "serve", "org/model", "-tp", "2", "--pipeline-parallel-size", "2", "--port", "8000"]
        engine = await KubernetesBackend(settings).launch(argv, run_id="r-host", image="vllm/vllm-openai:v1")
        assert engine.returncode is None and engine.address == ""
        (body,) = api.created
        spec = body["spec"]
        assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert "ports" not in spec["containers"][0]
        assert spec["containers"][0]["resources"]["limits"] == {GPU_RESOURCE: "4"}  # TP 2 x PP 2
        await engine.stop(1)
        assert engine.returncode is not None and api.pod_names() == [] and api.invalid == []
