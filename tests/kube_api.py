"""A local stand-in of the Kubernetes API for the kubernetes engine backend: just what it calls (Pods of one
namespace created, read, listed by label and field selector, deleted with a grace period, their log followed),
each created Pod checked against the Kubernetes schemas, and a kubelet for one node that admits Pods against its
GPUs as the device plugin would and runs the container as a local process: the vLLM image's entrypoint
(`vllm serve`) is vllm-sim (`python -m vllm_sim serve ARGS`), its Pod IP 127.0.0.1.

It serves from its own thread and event loop, as a real API server is another process: the runner's clean-up
at start-up calls it synchronously from the daemon's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kubernetes_validate
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES_VERSION = "1.31.0"
TOKEN = "test-token"
NODE = "gpu-node-1"
SIM_IMAGES = ("vllm/vllm-openai:", "vllm/vllm-openai@")  # images whose entrypoint is `vllm serve`
GPU = "nvidia.com/gpu"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class PodState:
    body: dict[str, Any]
    process: asyncio.subprocess.Process | None = None
    log: bytearray = field(default_factory=bytearray)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    running: bool = False
    tasks: list[asyncio.Future[None]] = field(default_factory=list)  # the kubelet's, kept while the Pod lives

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    def gpus(self) -> int:
        limits = self.body["spec"]["containers"][0].get("resources", {}).get("limits", {})
        return int(limits.get(GPU, 0))

    def holds_gpus(self) -> bool:
        return self.body["status"]["phase"] in ("Pending", "Running")


@dataclass
class KubeApi:
    """`scenario`/`speed`: what vllm-sim serves; `gpus`: the node's allocatable nvidia.com/gpu."""

    scenario: str = "healthy"
    speed: float = 10000.0
    namespace: str = "k3repro"
    gpus: int = 8
    requests: list[tuple[str, str]] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)  # created bodies the schemas refused, and why
    created: list[dict[str, Any]] = field(default_factory=list)  # every Pod body as the client sent it
    pods: dict[str, PodState] = field(default_factory=dict)
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None

    # --- the server's life (in its own thread) --------------------------------------------------------------

    @contextlib.contextmanager
    def serving(self) -> Iterator[KubeApi]:
        loop = asyncio.new_event_loop()
        self._loop = loop
        started = threading.Event()
        runner: list[web.AppRunner] = []

        async def start() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            app_runner = web.AppRunner(app)
            await app_runner.setup()
            site = web.TCPSite(app_runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"
            runner.append(app_runner)

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(start())
            started.set()
            loop.run_forever()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        started.wait(10)
        try:
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(self._shutdown(runner), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()

    async def _shutdown(self, runner: list[web.AppRunner]) -> None:
        for pod in list(self.pods.values()):
            if pod.process is not None and pod.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.process.pid, signal.SIGKILL)
                await pod.process.wait()
        for app_runner in runner:
            await app_runner.cleanup()

    def call(self, coroutine: Any) -> Any:
        """Runs a coroutine on the server's loop (for a test to set up or read its state)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    def pod_names(self) -> list[str]:
        async def names() -> list[str]:
            return sorted(self.pods)

        result: list[str] = self.call(names())
        return result

    # --- the API ----------------------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _json(_status(401, "Unauthorized", "Unauthorized"), 401)
        match = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods(?:/([^/]+))?(/log)?", request.path)
        if match is None or match.group(1) != self.namespace:
            return _json(_status(404, "NotFound", f"the server could not find {request.path}"), 404)
        name, log = match.group(2), match.group(3)
        if name is None and request.method == "POST":
            return await self._create(await request.json())
        if name is None and request.method == "GET":
            return self._list(request.query.get("labelSelector", ""), request.query.get("fieldSelector", ""))
        pod = self.pods.get(name or "")
        if pod is None:
            return _json(_status(404, "NotFound", f'pods "{name}" not found'), 404)
        if log and request.method == "GET":
            return await self._log(request, pod)
        if request.method == "GET":
            return _json(pod.body)
        if request.method == "DELETE":
            grace = int(request.query.get("gracePeriodSeconds", "30"))
            if "deletionTimestamp" not in pod.body["metadata"]:
                pod.body["metadata"]["deletionTimestamp"] = _now()
                pod.body["metadata"]["deletionGracePeriodSeconds"] = grace
                pod.tasks.append(asyncio.ensure_future(self._terminate(pod, grace)))
            return _json(pod.body)
        return _json(_status(405, "MethodNotAllowed", f"{request.method} is not allowed"), 405)

    async def _create(self, body: dict[str, Any]) -> web.Response:
        self.created.append(json.loads(json.dumps(body)))
        try:
            kubernetes_validate.validate(body, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            self.invalid.append(f"{body.get('metadata', {}).get('name')}: {exc}")
            return _json(_status(422, "Invalid", f"Pod is invalid: {exc}"), 422)
        name = body["metadata"]["name"]
        if name in self.pods:
            return _json(_status(409, "AlreadyExists", f'pods "{name}" already exists'), 409)
        body["metadata"].update(namespace=self.namespace, uid=hashlib.sha256(name.encode()).hexdigest()[:32])
        body["metadata"]["creationTimestamp"] = _now()
        body["status"] = {"phase": "Pending"}
        pod = self.pods[name] = PodState(body)
        pod.tasks.append(asyncio.ensure_future(self._kubelet(pod)))
        return _json(body, 201)

    def _list(self, labels: str, fields: str) -> web.Response:
        items = [p.body for p in self.pods.values() if _labels_match(p.body, labels) and _fields_match(p.body, fields)]
        return _json({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})

    async def _log(self, request: web.Request, pod: PodState) -> web.StreamResponse:
        if not pod.running and pod.exit_code is None:
            message = f'container "vllm" in pod "{pod.name}" is waiting to start: ContainerCreating'
            return _json(_status(400, "BadRequest", message), 400)
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        sent = 0
        follow = request.query.get("follow") == "true"
        while True:
            pod.changed.clear()
            if sent < len(pod.log):
                chunk = bytes(pod.log[sent:])
                sent += len(chunk)
                await response.write(chunk)
                continue
            if pod.exit_code is not None or not follow:
                break
            await pod.changed.wait()
        await response.write_eof()
        return response

    # --- the kubelet -------------------------------------------------------------------------------------------

    async def _kubelet(self, pod: PodState) -> None:
        spec, status = pod.body["spec"], pod.body["status"]
        if spec.get("nodeName") != NODE:
            status["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "no such node"}
            ]
            return  # never scheduled: Pending for ever
        used = sum(p.gpus() for p in self.pods.values() if p is not pod and p.holds_gpus())
        if pod.gpus() + used > self.gpus:
            status.update(
                phase="Failed",
                reason=f"Outof{GPU}",
                message=(
                    f"Pod was rejected: Node didn't have enough resource: {GPU}, requested: {pod.gpus()}, "
                    f"used: {used}, capacity: {self.gpus}"
                ),
            )
            return
        container = spec["containers"][0]
        image = container["image"]
        image_id = f"docker.io/{image.split(':')[0].split('@')[0]}@sha256:{hashlib.sha256(image.encode()).hexdigest()}"
        if not image.startswith(SIM_IMAGES):
            waiting = {"reason": "ErrImagePull", "message": f'failed to pull and unpack image "{image}": not found'}
            status["containerStatuses"] = [_container(container, {"waiting": waiting}, "")]
            return
        env = {
            **os.environ,
            "VLLM_SIM_SPEED": str(self.speed),
            "VLLM_SIM_SCENARIO": str(ROOT / "vllm_sim/data/scenarios" / f"{self.scenario}.toml"),
            **{e["name"]: e["value"] for e in container.get("env", [])},
        }
        command = [sys.executable, "-m", "vllm_sim", "serve", *container.get("args", [])]
        pod.process = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
        pod.running = True
        started = {"running": {"startedAt": _now()}}
        status.update(phase="Running", podIP="127.0.0.1", hostIP="127.0.0.1", startTime=_now())
        status["containerStatuses"] = [_container(container, started, image_id)]
        assert pod.process.stdout is not None
        while chunk := await pod.process.stdout.read(65536):
            pod.log += chunk
            pod.changed.set()
        code = await pod.process.wait()
        pod.exit_code = code if code >= 0 else 128 - code  # a signal, as the container runtime reports it
        terminated = {"terminated": {"exitCode": pod.exit_code, "reason": "Completed" if code == 0 else "Error"}}
        status.update(phase="Succeeded" if code == 0 else "Failed")
        status["containerStatuses"] = [_container(container, terminated, image_id)]
        pod.changed.set()

    async def _terminate(self, pod: PodState, grace: int) -> None:
        """SIGTERM, SIGKILL after the grace period, then the Pod is gone (a Pod that never ran goes at once)."""
        process = pod.process
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), grace)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            while pod.exit_code is None:  # the kubelet records the exit first
                await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        self.pods.pop(pod.name, None)


def _container(container: dict[str, Any], state: dict[str, Any], image_id: str) -> dict[str, Any]:
    return {
        "name": container["name"],
        "image": container["image"],
        "imageID": image_id,
        "state": state,
        "ready": "running" in state,
        "restartCount": 0,
    }


def _labels_match(body: dict[str, Any], selector: str) -> bool:
    labels = body["metadata"].get("labels", {})
    for term in filter(None, re.split(r",(?![^()]*\))", selector)):
        if match := re.fullmatch(r"\s*(\S+)\s+in\s+\((.*)\)\s*", term):
            if labels.get(match.group(1)) not in {v.strip() for v in match.group(2).split(",")}:
                return False
        elif "=" in term:
            key, _, value = term.partition("=")
            if labels.get(key.rstrip("=")) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(body: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if key != "spec.nodeName":
            raise ValueError(f"field selector {key} is not served by the stand-in")
        if body["spec"].get("nodeName") != value.lstrip("="):
            return False
    return True


def _json(data: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(data).encode(), status=status, headers={"Content-Type": "application/json"})


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Status",
        "metadata": {},
        "status": "Failure" if code >= 300 else "Success",
        "reason": reason,
        "message": message,
        "code": code,
    }
