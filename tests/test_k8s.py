"""The `kubernetes` isolation provider: the Job and DaemonSet manifests from deploy/k8s/, and the Job's life
through the Kubernetes API, against a local fake API server that records every request."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.config import IsolationConfig
from bot.coordinator import Coordinator
from bot.isolation import IsolationError
from bot.isolation.kubernetes import KubernetesProvider, render
from bot.rerun import rerun_isolated
from bot.store import AsyncStore, Store
from protos import runner_pb2 as pb
from runner.tls import DevCerts
from tests.k3fixtures import bot_config, runner_data, running_runner

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
TEMPLATE = K8S / "isolated-runner-job.json"
SELECTOR = {"k3repro.io/isolated": "true"}
TOLERATION = {"key": "k3repro.io/isolated", "operator": "Exists", "effect": "NoSchedule"}
ISOLATION = {
    "provider": "kubernetes",
    "namespace": "gpu",
    "image": "registry.example.internal/k3repro/runner:0.1.0",
    "job_template": str(TEMPLATE),
    "node_selector": SELECTOR,
    "tolerations": [TOLERATION],
    "time_limit": "01:30:00",
    "poll_s": 0.05,
}


@dataclass
class FakeApi:
    """Jobs are created, listed through their pods and deleted; `pending` polls before the pod runs."""

    pending: int = 2
    pod_ip: str = "127.0.0.1"
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path_qs, body))
        if request.headers.get("Authorization") != "Bearer test-token":
            return web.json_response({"message": "Unauthorized"}, status=401)
        path = request.path
        if request.method == "POST" and path == "/apis/batch/v1/namespaces/gpu/jobs":
            self.jobs[body["metadata"]["name"]] = body
            return web.json_response(body, status=201)
        if request.method == "GET" and path == "/api/v1/namespaces/gpu/pods":
            if self.pending > 0:
                self.pending -= 1
                condition = {"type": "PodScheduled", "status": "False", "message": "0/4 nodes are available"}
                return web.json_response({"items": [{"status": {"phase": "Pending", "conditions": [condition]}}]})
            pod = {"spec": {"nodeName": "gpu-b7"}, "status": {"phase": "Running", "podIP": self.pod_ip}}
            return web.json_response({"items": [pod]})
        name = path.rsplit("/", 1)[-1]
        if request.method == "DELETE":
            return web.json_response({"status": "Success"}) if self.jobs.pop(name, None) else _missing()
        if request.method == "GET" and path.startswith("/apis/batch/v1/namespaces/gpu/jobs/"):
            return web.json_response(self.jobs[name]) if name in self.jobs else _missing()
        return _missing()


def _missing() -> web.Response:
    return web.json_response({"message": "not found"}, status=404)


@contextlib.asynccontextmanager
async def fake_api(api: FakeApi) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", api.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def _config(tmp_path: Path, url: str, **extra: Any) -> IsolationConfig:
    token = tmp_path / "token"
    token.write_text("test-token\n")
    data = {**ISOLATION, "api_url": url, "token_file": str(token), **extra}
    config = bot_config(None, tmp_path / "k3.db", ["127.0.0.1:1"], isolation=data)
    isolation = config.clusters["cluster-a"].isolation
    assert isolation is not None
    return isolation


def test_the_job_template_renders_a_placed_once_runner_with_its_tls_secret(tmp_path: Path) -> None:
    job = KubernetesProvider(_config(tmp_path, "http://unused")).job("20261130-101010-AB12")
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    meta, spec = job["metadata"], job["spec"]
    assert meta["name"] == "k3repro-rerun-20261130-101010-ab12" and meta["namespace"] == "gpu"
    assert meta["labels"]["k3repro.io/rerun"] == "20261130-101010-ab12"
    assert spec["backoffLimit"] == 0 and spec["activeDeadlineSeconds"] == 5400
    pod = spec["template"]["spec"]
    assert spec["template"]["metadata"]["labels"] == meta["labels"]
    assert pod["restartPolicy"] == "Never" and pod["nodeSelector"] == SELECTOR and pod["tolerations"] == [TOLERATION]
    (container,) = pod["containers"]
    assert container["image"] == ISOLATION["image"]
    assert container["command"] == ["k3repro-runner", "serve", "--once", "--config", "/etc/k3repro/runner.toml"]
    assert container["ports"] == [{"name": "grpc", "containerPort": 50051, "protocol": "TCP"}]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tls"]["mountPath"] == "/etc/k3repro/tls" and mounts["tls"]["readOnly"] is True
    assert volumes["tls"]["secret"]["secretName"] == "k3repro-runner-tls"
    assert volumes["config"]["configMap"]["name"] == "k3repro-isolated-runner"
    assert set(mounts) == set(volumes)
    assert "${" not in json.dumps(job)


def test_the_daemonset_runs_a_runner_on_every_regular_gpu_host_but_not_on_isolated_ones() -> None:
    ds = json.loads((K8S / "runner-daemonset.json").read_text())
    assert (ds["apiVersion"], ds["kind"]) == ("apps/v1", "DaemonSet")
    template = ds["spec"]["template"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    pod = template["spec"]
    assert pod["nodeSelector"] == {"k3repro.io/gpu-host": "true"}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "k3repro.io/isolated", "operator": "DoesNotExist"} in terms[0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (container,) = pod["containers"]
    assert container["command"] == ["k3repro-runner", "serve", "--config", "/etc/k3repro/runner.toml"]
    assert container["ports"][0]["hostPort"] == container["ports"][0]["containerPort"] == 50051
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tls"] == "/etc/k3repro/tls" and volumes["tls"]["secret"]["secretName"] == "k3repro-runner-tls"
    assert mounts["docker"] == "/var/run/docker.sock" and set(mounts) == set(volumes)


def test_a_template_with_an_unknown_placeholder_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "job.json"
    bad.write_text('{"metadata": {"name": "x-${NOPE}"}}')
    with pytest.raises(IsolationError, match="unknown placeholder 'NOPE'"):
        render(bad, {})


async def test_a_rerun_creates_the_job_connects_to_its_pod_and_deletes_it(certs: DevCerts, tmp_path: Path) -> None:
    api = FakeApi()
    regular = runner_data(certs, tmp_path / "regular", scenario="demo", speed=800)
    isolated = runner_data(certs, tmp_path / "isolated", scenario="demo", speed=800, name="pod", labels=["isolated"])
    async with fake_api(api) as url, running_runner(regular) as a, running_runner(isolated) as b:
        token = tmp_path / "token"
        token.write_text("test-token")
        isolation = {**ISOLATION, "api_url": url, "token_file": str(token), "runner_port": b.port}
        config = bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{a.port}"], isolation=isolation)
        store = AsyncStore(config.store)
        core = Coordinator(config, store)
        started = await core.start("cluster-a", "U1")
        await core.follow(started, _ignore)
        outcome = await rerun_isolated(core, started.run_id, "U2", _ignore)
        link = await store.call(Store.reruns_of, started.run_id)
        store.close()
    name = f"k3repro-rerun-{outcome.run_id.lower()}"
    assert outcome.comparison["verdict"] == "reproduced"
    assert outcome.placement.address == f"127.0.0.1:{b.port}"
    assert outcome.placement.where == f"kubernetes job gpu/{name} on node gpu-b7"
    methods = [(method, path.split("?")[0]) for method, path, _ in api.requests]
    assert methods[0] == ("POST", "/apis/batch/v1/namespaces/gpu/jobs")
    assert methods[1:4] == [("GET", "/api/v1/namespaces/gpu/pods")] * 3  # pending twice, then running
    assert ("DELETE", f"/apis/batch/v1/namespaces/gpu/jobs/{name}") in methods and api.jobs == {}
    assert api.requests[1][1].endswith(f"labelSelector=job-name%3D{name}")
    delete = next(body for method, _, body in api.requests if method == "DELETE")
    assert delete == {"propagationPolicy": "Background"}
    assert link[0]["provider"] == "kubernetes" and link[0]["verdict"] == "reproduced"


async def test_a_pod_that_never_runs_is_reported_and_its_job_deleted(tmp_path: Path) -> None:
    api = FakeApi(pending=10_000)
    async with fake_api(api) as url:
        provider = KubernetesProvider(_config(tmp_path, url, queue_wait_s=0.3))
        with pytest.raises(IsolationError) as caught:
            await provider.acquire("r1")
    assert str(caught.value) == (
        "kubernetes job k3repro-rerun-r1 did not start within 0.3 s (Pending: 0/4 nodes are available); it was deleted"
    )
    assert api.jobs == {} and api.requests[-2][0] == "DELETE"


async def test_an_api_that_refuses_is_one_line_and_nothing_is_left(tmp_path: Path) -> None:
    api = FakeApi()
    async with fake_api(api) as url:
        provider = KubernetesProvider(_config(tmp_path, url, token_file=str(tmp_path / "wrong")))
        (tmp_path / "wrong").write_text("expired")
        with pytest.raises(
            IsolationError, match=r"^kubernetes API POST /apis/batch/v1/namespaces/gpu/jobs: 401 Unauthorized$"
        ):
            await provider.acquire("r1")
    assert api.jobs == {}


async def _ignore(event: pb.RunEvent) -> None:
    """The store keeps the events; these tests read the outcome."""
