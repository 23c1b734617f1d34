"""The kubernetes engine: each launch is a Pod of the (allowlisted) image on this runner's own node, through the
API server, with its GPUs requested from the device plugin.

On a Kubernetes GPU node there is no Docker socket (the kubelet runs containerd), and an engine started behind
the kubelet's back takes GPUs the device plugin believes are free. So the runner asks the API server: a Pod with
`spec.nodeName` = this node, `resources.limits["nvidia.com/gpu"]` = the GPUs the command uses, the image's
entrypoint (`vllm serve`, as in vLLM's images) given the launch's arguments as `args` (a list, never a shell
line). The log is `pods/log?follow=true`, read as bytes through the shared line splitter; the stop is a delete
with the grace period, waited for until the Pod is gone; the exit code is the container's terminated state. Pods
carry the run id as a label, so a runner restart deletes what the runs it left unfinished started.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from lightkube import ApiError, AsyncClient, Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.config.models import Cluster, User
from lightkube.resources.core_v1 import Pod

from kernel.clock import WALL, Clock
from kernel.vllm_cli import parse_launch_command, split_program
from runner.config import KubernetesSettings
from runner.engines.base import LogLine
from runner.engines.fresh_caches import CONTAINER_ROOT, redirect
from runner.engines.lines import LineSplitter
from runner.nvml import NvmlSource, PynvmlSource
from runner.stacks.summary import ProcessDump

log = logging.getLogger(__name__)

RUN_LABEL = "k3repro.io/run-id"
LAUNCH_LABEL = "k3repro.io/launch"
GPU_RESOURCE = "nvidia.com/gpu"
CONTAINER = "vllm"
REFUSED_EXIT = 125  # as `docker run` exits when the daemon refuses the container: the engine never ran
GONE_EXIT = 137  # a Pod that went without a terminated state to read (deleted, evicted): killed
POLL_S = 0.5  # engine seconds between two looks at the Pod (Clock.poll keeps a wall floor)
GONE_S = 60.0  # wall seconds past the grace period for a deleted Pod to be gone
# Container states that will not turn into a running engine on their own: the launch failed, in the kubelet's words.
STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def engine_clock() -> Clock:
    """The engine's time: a real engine's is the wall clock (tests whose Pods run vllm-sim replace this)."""
    return Clock()


def run_label(run_id: str) -> str:
    """The run id as a label value (63 characters of [A-Za-z0-9_.-]); another run id by its hash."""
    if _LABEL_VALUE.match(run_id):
        return run_id
    return "h-" + hashlib.sha256(run_id.encode()).hexdigest()[:32]


def gpu_count(argv: list[str]) -> int:
    """The GPUs `vllm serve` uses on one node: tensor x pipeline parallel size (1 each when not given)."""
    try:
        command = parse_launch_command(argv)
    except Exception:  # an argv the table cannot read: the engine will say why; it asked for no more than one
        return 1
    count = 1
    for flag in ("--tensor-parallel-size", "--pipeline-parallel-size"):
        value = command.value(flag)
        if isinstance(value, str) and value.isdigit() and int(value) > 0:
            count *= int(value)
    return count


def _port(args: list[str]) -> int | None:
    """The value of --port in the arguments (the launcher always sets it), for the Pod's containerPort."""
    for index, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--port=") else None
        if arg == "--port" and index + 1 < len(args):
            value = args[index + 1]
        if value is not None and value.isdigit() and 0 < int(value) < 65536:
            return int(value)
    return None


def pod_manifest(
    settings: KubernetesSettings,
    node: str,
    argv: list[str],
    *,
    run_id: str,
    image: str,
    launch: int,
    fresh_caches: bool = False,
) -> dict[str, Any]:
    """The Pod of one launch, as the API takes it; `fresh_caches` points every cache at an empty path inside the
    container's own filesystem (runner/engines/fresh_caches.py)."""
    _, args = split_program(argv)
    slug = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")[:40].strip("-") or "run"
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "args": list(args),  # the image's entrypoint is `vllm serve`: the arguments, each its own string
        "env": [
            {"name": key, "value": value}
            for key, value in {**dict(settings.env), **(redirect(CONTAINER_ROOT) if fresh_caches else {})}.items()
        ],
        "volumeMounts": [],
    }
    if settings.gpus:
        container["resources"] = {"limits": {GPU_RESOURCE: str(gpu_count(argv))}}
    port = _port(args)
    if port is not None and not settings.host_network:
        container["ports"] = [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    volumes: list[dict[str, Any]] = []
    for index, spec in enumerate(settings.volumes):
        host, _, rest = spec.partition(":")
        path, _, mode = rest.partition(":")
        volumes.append({"name": f"volume-{index}", "hostPath": {"path": host}})
        container["volumeMounts"].append({"name": f"volume-{index}", "mountPath": path, "readOnly": mode == "ro"})
    spec_: dict[str, Any] = {
        "nodeName": node,  # this runner's node: the kubelet admits it against the device plugin's GPUs
        "restartPolicy": "Never",
        "hostIPC": True,  # as `docker run --ipc host`: NCCL and vLLM's workers share memory through /dev/shm
        "hostNetwork": settings.host_network,
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists"}],
        "containers": [container],
        "volumes": volumes,
    }
    if settings.host_network:
        spec_["dnsPolicy"] = "ClusterFirstWithHostNet"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"k3repro-{slug}-{launch}-{secrets.token_hex(3)}",
            "namespace": settings.namespace,
            "labels": {
                "app.kubernetes.io/name": "k3repro-engine",
                RUN_LABEL: run_label(run_id),
                LAUNCH_LABEL: str(launch),
            },
        },
        "spec": spec_,
    }


def _kube_config(settings: KubernetesSettings) -> KubeConfig:
    cluster = Cluster(server=settings.api_url, certificate_auth=str(settings.ca_file) if settings.ca_file else None)
    user = User(token_file=str(settings.token_file)) if settings.token_file is not None else None
    return KubeConfig.from_one(cluster=cluster, user=user, namespace=settings.namespace)


def _api_message(exc: BaseException) -> str:
    """What the API (or the network) answered, in one line."""
    if isinstance(exc, ApiError):
        return f"{exc.status.code} {exc.status.reason or ''}: {exc.status.message or ''}".strip()
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{exc.response.status_code} {exc.response.reason_phrase}"
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _missing(exc: BaseException) -> bool:
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code == 404


def _container_state(pod: Pod) -> Any:
    statuses = (pod.status.containerStatuses if pod.status is not None else None) or []
    status = next((s for s in statuses if s.name == CONTAINER), None)
    return status


def exit_code(pod: Pod) -> int | None:
    """The engine container's exit code, once it terminated."""
    status = _container_state(pod)
    terminated = status.state.terminated if status is not None and status.state is not None else None
    return int(terminated.exitCode) if terminated is not None else None


class KubernetesEngine:
    """One launch's Pod; `address` is where its server listens (the Pod's IP), or "" for the launch host."""

    def __init__(self, backend: KubernetesBackend, client: AsyncClient | None, name: str, refusal: str = "") -> None:
        self._backend = backend
        self._client = client
        self.name = name
        self._refusal = refusal
        self._returncode: int | None = REFUSED_EXIT if refusal else None
        self._image_id = ""
        self.address = ""
        self._log_done = client is None
        self._deleting = client is None  # a delete was sent (or there is nothing to delete)
        self._gone = client is None  # ... and it is over: the Pod is gone (or given up on)
        self._last_code: int | None = None  # the terminated state seen last, while the Pod was going

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def image_id(self) -> str:
        return self._image_id

    @property
    def namespace(self) -> str:
        return self._backend.settings.namespace

    async def dump_stacks(self, limit_s: float) -> list[ProcessDump]:
        """The runner's role has no pods/exec (deploy/k8s/runner-rbac.yaml): the stacks are reported as out of
        reach, with what an engineer runs instead."""
        why = f"the runner does not exec into Pods: kubectl debug -n {self.namespace} {self.name} (py-spy dump)"
        return [ProcessDump(0, error=why, label=f"pod {self.name}")]

    async def started(self, timeout_s: float) -> None:
        """Waits until the Pod runs (its IP is the server's address) or ended at once; a Pod the node refused,
        whose image cannot be pulled or that is not running within `timeout_s` wall seconds becomes a refusal
        (its reason in the kubelet's words) and is deleted."""
        assert self._client is not None
        deadline = WALL.monotonic() + timeout_s
        why = "Pending"
        while True:
            try:
                pod = await self._client.get(Pod, self.name, namespace=self.namespace)
            except Exception as exc:
                return await self._refuse(f"kubernetes: pod {self.name}: {_api_message(exc)}")
            status = pod.status
            phase = (status.phase if status is not None else None) or "Pending"
            container = _container_state(pod)
            if container is not None and container.imageID:
                self._image_id = str(container.imageID)
            ip = (status.podIP if status is not None else None) or ""
            if exit_code(pod) is not None or (phase == "Running" and ip):
                self.address = "" if self._backend.settings.host_network else ip
                return
            if phase in ("Failed", "Succeeded"):  # ended with no container run: the kubelet refused the Pod
                reason = (status.reason if status is not None else None) or phase
                message = (status.message if status is not None else None) or "no message"
                return await self._refuse(f"kubernetes: pod {self.name} {phase.lower()}: {reason}: {message}")
            waiting = container.state.waiting if container is not None and container.state is not None else None
            if waiting is not None and waiting.reason:
                why = f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
                if waiting.reason in STUCK_REASONS:
                    return await self._refuse(f"kubernetes: pod {self.name}: {why}")
            elif status is not None and status.conditions:
                why = next((f"{c.reason}: {c.message}" for c in status.conditions if c.message), why)
            if WALL.monotonic() >= deadline:
                return await self._refuse(
                    f"kubernetes: pod {self.name} not running after {timeout_s:g} s ({phase}: {why})"
                )
            await self._backend.clock.poll(POLL_S)

    async def _refuse(self, line: str) -> None:
        self._refusal = line
        self._returncode = REFUSED_EXIT
        self._log_done = True
        await self._delete(grace_s=0)
        await self._finish()  # the client closes: nothing reads through it

    async def lines(self) -> AsyncIterator[LogLine]:
        if self._refusal:
            yield LogLine("stderr", self._refusal)
            return
        assert self._client is not None
        splitter = LineSplitter()
        ended = ""
        try:
            request = self._client._client.prepare_request(  # lightkube's own log() splits lines unbounded
                "get",
                Pod.Log,
                name=self.name,
                namespace=self.namespace,
                params={"container": CONTAINER, "follow": True},
            )
            adapter = self._client._client.build_adapter_request(request)
            response: httpx.Response = await self._client._client.send(adapter, stream=True)  # type: ignore[no-untyped-call]
            try:
                if response.is_error:
                    await response.aread()
                    response.raise_for_status()
                async for chunk in response.aiter_bytes():
                    for text in splitter.feed(chunk):
                        yield LogLine("stdout", text)
            finally:
                await response.aclose()
        except (httpx.HTTPError, ApiError) as exc:  # the Pod went away mid-stream: say so in the log
            ended = f"[log stream ended: {_api_message(exc)}]"
        for text in splitter.close():
            yield LogLine("stdout", text)
        if ended:
            yield LogLine("stderr", ended)
        self._log_done = True
        await self._finish()

    async def wait(self) -> int:
        while self._returncode is None and self._client is not None:
            try:
                pod = await self._client.get(Pod, self.name, namespace=self.namespace)
            except Exception as exc:
                if _missing(exc):
                    self._returncode = self._last_code if self._last_code is not None else GONE_EXIT
                    break
                pod = None
            if pod is not None and (code := exit_code(pod)) is not None:
                self._returncode = code
                break
            await self._backend.clock.poll(POLL_S)
        await self._finish()
        return self._returncode if self._returncode is not None else GONE_EXIT

    async def stop(self, grace_s: float) -> None:
        """Deletes the Pod with `grace_s` (engine seconds) between SIGTERM and SIGKILL, and waits until it is gone."""
        if self._client is None or self._deleting:
            return
        await self._delete(grace_s)
        if self._returncode is None:
            self._returncode = self._last_code if self._last_code is not None else GONE_EXIT
        await self._finish()

    async def _finish(self) -> None:
        """An engine that ended by itself: its Pod goes once its log was read and its exit code known; the client
        closes once nothing reads through it any more."""
        if self._client is None:
            return
        if not self._deleting and self._log_done and self._returncode is not None:
            await self._delete(grace_s=0)
        if self._gone and self._log_done and self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):
                await client.close()

    async def _delete(self, grace_s: float) -> None:
        client = self._client
        assert client is not None
        self._deleting = True
        try:
            await self._delete_and_wait(client, max(1, math.ceil(self._backend.clock.wall(grace_s))))
        finally:
            self._gone = True

    async def _delete_and_wait(self, client: AsyncClient, grace: int) -> None:
        try:
            await client.delete(Pod, self.name, namespace=self.namespace, grace_period=grace)
        except Exception as exc:
            if not _missing(exc):
                log.warning("kubernetes: deleting pod %s: %s", self.name, _api_message(exc))
                return
        deadline = WALL.monotonic() + grace + GONE_S
        while WALL.monotonic() < deadline:
            try:
                pod = await client.get(Pod, self.name, namespace=self.namespace)
            except Exception as exc:
                if _missing(exc):
                    return
                pod = None
            if pod is not None and (code := exit_code(pod)) is not None:
                self._last_code = code
            await self._backend.clock.poll(POLL_S)
        log.warning("kubernetes: pod %s is still there %g s after its delete", self.name, grace + GONE_S)


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, settings: KubernetesSettings, nvml: NvmlSource | None = None) -> None:
        self.settings = settings
        self.node = settings.node_name or os.environ.get("NODE_NAME", "")
        self.nvml: NvmlSource = nvml or PynvmlSource()  # the runner runs on the GPU node: its NVML is the node's
        self.clock = engine_clock()
        self._launches = 0

    def refusal(self, argv: list[str]) -> str:
        if not self.node:
            return "the kubernetes backend does not know its node: set [engine.kubernetes] node_name or NODE_NAME"
        return ""  # the image (allowlisted) runs its own entrypoint; argv[0] is never run on the host

    def probe_target(self, argv: list[str], image: str) -> None:
        """Nothing: the image's versions would be read through a Docker daemon, which a containerd node lacks."""
        return None

    def _client(self) -> AsyncClient:
        return AsyncClient(_kube_config(self.settings), timeout=httpx.Timeout(30.0, read=None), trust_env=False)

    async def launch(
        self, argv: list[str], *, run_id: str, image: str, fresh_caches: Path | None = None
    ) -> KubernetesEngine:
        self._launches += 1
        body = pod_manifest(
            self.settings,
            self.node,
            argv,
            run_id=run_id,
            image=image,
            launch=self._launches,
            fresh_caches=fresh_caches is not None,
        )
        name = body["metadata"]["name"]
        client = self._client()
        try:
            await client.create(from_dict(body))
        except Exception as exc:  # the API's refusal is the finding, in its own words
            with contextlib.suppress(Exception):
                await client.close()
            return KubernetesEngine(self, None, name, f"kubernetes: creating pod {name}: {_api_message(exc)}")
        engine = KubernetesEngine(self, client, name)
        try:
            await engine.started(self.settings.start_timeout_s)
        except BaseException:
            await engine.stop(0)
            raise
        return engine

    def scene_files(self) -> dict[str, str]:
        return {}

    def remove_leftovers(self, run_ids: set[str]) -> int:
        """Deletes the Pods on this node of runs a previous runner process left unfinished, and waits (bounded)
        until they are gone: until then the kubelet counts their GPUs as taken."""
        if not self.node or not run_ids:
            return 0
        wanted = {run_label(run_id) for run_id in run_ids}
        client = Client(_kube_config(self.settings), timeout=httpx.Timeout(30.0), trust_env=False)
        removed: list[str] = []
        selectors: dict[str, Any] = {
            "namespace": self.settings.namespace,
            "labels": {RUN_LABEL: sorted(wanted)},
            "fields": {"spec.nodeName": self.node},
        }
        try:
            for pod in client.list(Pod, **selectors):
                labels = (pod.metadata.labels if pod.metadata is not None else None) or {}
                name = pod.metadata.name if pod.metadata is not None else None
                if name and labels.get(RUN_LABEL) in wanted:
                    client.delete(Pod, name, namespace=self.settings.namespace, grace_period=1)
                    removed.append(name)
            deadline = WALL.monotonic() + GONE_S
            while removed and WALL.monotonic() < deadline:
                left = {p.metadata.name for p in client.list(Pod, **selectors) if p.metadata}
                if not left & set(removed):
                    break
                WALL.pause(0.2)
        except Exception as exc:
            log.warning("kubernetes: removing the pods of unfinished runs: %s", _api_message(exc))
        finally:
            client.close()
        return len(removed)
