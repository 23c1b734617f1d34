"""The `kubernetes` isolation provider: the manifests in deploy/k8s/ (each validated against the Kubernetes
schemas, offline), and the Job's life through lightkube against a local fake API server that records every
request (and whose every request the bot's Role allows)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes_validate
import pytest
import yaml
from aiohttp import web

from bot.config import IsolationConfig
from bot.coordinator import Coordinator
from bot.isolation import IsolationError
from bot.isolation.kubernetes import KubernetesProvider, render
from bot.rerun import rerun_isolated
from bot.store import AsyncStore, Store
from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from runner.config import KubernetesSettings, parse_runner_config
from runner.engines.kubernetes import KubernetesBackend
from runner.ports import free_port
from tests.k3fixtures import bot_config, runner_data, running_runner
from tests.kube_api import NODE, TOKEN, KubeApi

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
TEMPLATE = K8S / "isolated-runner-job.yaml"
KUBERNETES_VERSION = "1.31.0"  # the oldest release the manifests are checked against (strict: no unknown fields)
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
    """Jobs are created, listed through their pods and deleted; `pending` polls before the pod runs. Answers
    are shaped as the API server's: `application/json`, kinds and list metadata, a Pod made from its Job."""

    pending: int = 2
    pod_ip: str = "127.0.0.1"
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path_qs, body))
        if request.headers.get("Authorization") != "Bearer test-token":
            return _json(_status(401, "Unauthorized"), 401)
        path = request.path
        if request.method == "POST" and path == "/apis/batch/v1/namespaces/gpu/jobs":
            self.jobs[body["metadata"]["name"]] = body
            return _json(body, 201)
        if request.method == "GET" and path == "/api/v1/namespaces/gpu/pods":
            job = request.query["labelSelector"].removeprefix("job-name=")
            pods = [] if job not in self.jobs else [self._pod(job)]
            return _json({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "7"}, "items": pods})
        name = path.rsplit("/", 1)[-1]
        if request.method == "DELETE":
            return _json(_status(200, "")) if self.jobs.pop(name, None) else _missing(name)
        if request.method == "GET" and path.startswith("/apis/batch/v1/namespaces/gpu/jobs/"):
            return _json(self.jobs[name]) if name in self.jobs else _missing(name)
        return _missing(name)

    def _pod(self, job: str) -> dict[str, Any]:
        template = self.jobs[job]["spec"]["template"]
        metadata = {
            "name": f"{job}-x7k2p",
            "namespace": "gpu",
            "labels": {**template["metadata"]["labels"], "job-name": job},
        }
        if self.pending > 0:
            self.pending -= 1
            condition = {"type": "PodScheduled", "status": "False", "message": "0/4 nodes are available"}
            status: dict[str, Any] = {"phase": "Pending", "conditions": [condition]}
            spec = template["spec"]
        else:
            status = {"phase": "Running", "podIP": self.pod_ip}
            spec = {**template["spec"], "nodeName": "gpu-b7"}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def _json(data: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json"})


def _status(code: int, message: str) -> dict[str, Any]:
    failure = code >= 300
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure" if failure else "Success",
        "message": message,
        "code": code,
    }


def _missing(name: str) -> web.Response:
    return _json(_status(404, f'jobs.batch "{name}" not found'), 404)


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
    ds = yaml.safe_load((K8S / "runner-daemonset.yaml").read_text())
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
    ports = {p["name"]: p for p in container["ports"]}
    assert ports["grpc"]["hostPort"] == ports["grpc"]["containerPort"] == 50051
    assert ports["metrics"]["containerPort"] == 9400  # deploy/config/runner.toml's [metrics] listen
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tls"] == "/etc/k3repro/tls" and volumes["tls"]["secret"]["secretName"] == "k3repro-runner-tls"
    assert set(mounts) == set(volumes)
    assert not [v for v in volumes.values() if "docker" in json.dumps(v)]  # no Docker socket: engines are Pods
    assert pod["serviceAccountName"] == "k3repro-runner" and pod["automountServiceAccountToken"] is True
    (node,) = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert node["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}


def test_the_daemonsets_runner_launches_engines_as_pods_on_its_node(tmp_path: Path) -> None:
    documents = {(d["kind"], d["metadata"]["name"]): d for _, d in _manifests()}
    text = documents[("ConfigMap", "k3repro-runner")]["data"]["runner.toml"]
    config = parse_runner_config(tomllib.loads(text), base=tmp_path, origin="k3repro-runner runner.toml")
    assert config.engine.backend == "kubernetes"
    settings = config.engine.kubernetes
    assert settings.namespace == documents[("ServiceAccount", "k3repro-runner")]["metadata"]["namespace"]
    assert str(settings.token_file) == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert settings.node_name == ""  # NODE_NAME, from the DaemonSet's downward API


def test_a_template_with_an_unknown_placeholder_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text('{"metadata": {"name": "x-${NOPE}"}}')
    with pytest.raises(IsolationError, match="unknown placeholder 'NOPE'"):
        render(bad, {})


async def test_a_rerun_creates_the_job_connects_to_its_pod_and_deletes_it(certs: DevCerts, tmp_path: Path) -> None:
    api = FakeApi()
    regular = runner_data(certs, tmp_path / "regular", scenario="demo")
    isolated = runner_data(certs, tmp_path / "isolated", scenario="demo", name="pod", labels=["isolated"])
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
    assert parse_qs(urlsplit(api.requests[1][1]).query)["labelSelector"] == [f"job-name={name}"]
    delete = next(path for method, path, _ in api.requests if method == "DELETE")
    assert parse_qs(urlsplit(delete).query)["propagationPolicy"] == ["Background"]  # the Job's pods go too
    allowed = _allowed_by_the_bot_role()
    for method, path, _ in api.requests:
        assert _verb(method, path) in allowed, (method, path)
    assert link[0].provider == "kubernetes" and link[0].verdict == "reproduced"


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


def _manifests() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, document)
        for path in sorted(K8S.glob("*.yaml"))
        if path != TEMPLATE
        for document in yaml.safe_load_all(path.read_text())
    ]


def _allowed_by_the_bot_role() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) the bot's ServiceAccount may use, through its RoleBinding."""
    return _allowed_by_role_of("k3repro-bot", bound_in="Deployment")


def _allowed_by_role_of(account_name: str, bound_in: str) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) the ServiceAccount may use, through its RoleBinding (`bound_in`: the kind of
    the workload that runs as it)."""
    documents = {(d["kind"], d["metadata"]["name"]): d for _, d in _manifests()}
    account = documents[("ServiceAccount", account_name)]
    subject = {"kind": "ServiceAccount", "name": account_name, "namespace": account["metadata"]["namespace"]}
    (binding,) = [d for (kind, _), d in documents.items() if kind == "RoleBinding" and subject in d["subjects"]]
    workload = next(d for (kind, _), d in documents.items() if kind == bound_in)
    assert workload["spec"]["template"]["spec"]["serviceAccountName"] == account_name
    role = documents[("Role", binding["roleRef"]["name"])]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _verb(method: str, path_qs: str) -> tuple[str, str, str]:
    """The RBAC verb a request to the fake API needs: /api/v1/namespaces/NS/pods (core) or /apis/G/V/..."""
    parts = urlsplit(path_qs).path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    resource, named = rest[2], len(rest) > 3
    verb = {"POST": "create", "DELETE": "delete", "GET": "get" if named else "list"}[method]
    return group, resource, verb


def test_every_manifest_validates_against_the_kubernetes_schemas(tmp_path: Path) -> None:
    rendered = KubernetesProvider(_config(tmp_path, "http://unused")).job("20261130-101010-AB12")
    documents = [*_manifests(), (TEMPLATE.name, rendered)]
    kinds = {document["kind"] for _, document in documents}
    assert kinds >= {"DaemonSet", "Deployment", "Service", "Job", "ServiceAccount", "Role", "RoleBinding"}
    assert kinds >= {"Secret", "ConfigMap"}
    for name, document in documents:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        assert document["metadata"].get("namespace", "k3repro") in ("k3repro", "gpu"), name


def test_the_schema_check_catches_a_misspelt_field() -> None:
    ds = yaml.safe_load((K8S / "runner-daemonset.yaml").read_text())
    ds["spec"]["template"]["spec"]["nodeSelecter"] = ds["spec"]["template"]["spec"].pop("nodeSelector")
    with pytest.raises(kubernetes_validate.ValidationError, match="nodeSelecter"):
        kubernetes_validate.validate(ds, KUBERNETES_VERSION, strict=True)


def test_every_secret_and_config_map_a_pod_mounts_is_in_the_layout(tmp_path: Path) -> None:
    documents = _manifests()
    provided = {(d["kind"], d["metadata"]["name"]) for _, d in documents}
    job = KubernetesProvider(_config(tmp_path, "http://unused")).job("r1")
    pods = [d["spec"]["template"]["spec"] for _, d in documents if d["kind"] in ("DaemonSet", "Deployment")]
    for pod in [*pods, job["spec"]["template"]["spec"]]:
        for volume in pod["volumes"]:
            if "secret" in volume:
                assert ("Secret", volume["secret"]["secretName"]) in provided
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in provided
            if "persistentVolumeClaim" in volume:
                assert ("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]) in provided
        for container in pod["containers"]:
            for source in container.get("envFrom", []):
                assert ("Secret", source["secretRef"]["name"]) in provided


async def _ignore(event: pb.RunEvent) -> None:
    """The store keeps the events; these tests read the outcome."""


async def test_the_runners_role_allows_every_request_its_kubernetes_engine_makes(tmp_path: Path) -> None:
    """A launch (create, read until running, log followed), its stop (delete, read until gone) and the clean-up of
    an unfinished run's Pods (list, delete) against the stand-in API: each request is one the Role grants."""
    token = tmp_path / "token"
    token.write_text(f"{TOKEN}\n")
    with KubeApi(speed=1000).serving() as api:
        settings = KubernetesSettings(api_url=api.url, token_file=token, node_name=NODE)
        argv = ["vllm", "serve", "org/model", "--host", "127.0.0.1", "--port", str(free_port("127.0.0.1"))]
        engine = await KubernetesBackend(settings).launch(argv, run_id="r1", image="vllm/vllm-openai:v1")
        lines = engine.lines()
        assert (await anext(lines)).text  # the log, followed
        await engine.stop(1)
        async for _ in lines:
            pass
        await KubernetesBackend(settings).launch(argv, run_id="r2", image="vllm/vllm-openai:v1")
        assert await asyncio.to_thread(KubernetesBackend(settings).remove_leftovers, {"r2"}) == 1
        assert api.pod_names() == [] and api.invalid == []
        requests = list(api.requests)
    allowed = _allowed_by_role_of("k3repro-runner", bound_in="DaemonSet")
    needed = {_pod_verb(method, path) for method, path in requests}
    assert needed == {("", "pods", v) for v in ("create", "get", "list", "delete")} | {("", "pods/log", "get")}
    assert needed <= allowed


def _pod_verb(method: str, path_qs: str) -> tuple[str, str, str]:
    """The RBAC verb of a request to the stand-in: /api/v1/namespaces/NS/pods[/NAME[/log]]."""
    parts = urlsplit(path_qs).path.strip("/").split("/")
    assert parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods", path_qs
    resource = "pods/log" if parts[6:] == ["log"] else "pods"
    verb = {"POST": "create", "DELETE": "delete", "GET": "get" if len(parts) > 5 else "list"}[method]
    return "", resource, verb
