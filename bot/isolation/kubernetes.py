"""`kubernetes`: one Job per rerun from the template in deploy/k8s/, placed by node selector and tolerations,
started, watched and removed through lightkube (its client: auth, TLS, rotated service-account tokens)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from string import Template
from typing import Any, TypeVar

import httpx
import yaml
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.codecs import from_dict
from lightkube.config.models import Cluster, User
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Pod
from lightkube.types import CascadeType

from bot.config import IsolationConfig
from bot.isolation.base import IsolationError, Placement
from kernel.clock import WALL, WallClock

GONE_S = 30.0
T = TypeVar("T")


def render(template: Path, values: dict[str, Any]) -> dict[str, Any]:
    """The template (YAML) with `${NAME}` filled in; a string that is only `${NAME}` takes the value as it is
    (a number, a table, a list), so structure is never built from text."""
    try:
        document = yaml.safe_load(template.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise IsolationError(f"job template {template}: {exc}") from None

    def fill(node: Any) -> Any:
        if isinstance(node, dict):
            return {key: fill(value) for key, value in node.items()}
        if isinstance(node, list):
            return [fill(value) for value in node]
        if isinstance(node, str):
            whole = node.removeprefix("${").removesuffix("}")
            if node.startswith("${") and whole in values:
                return values[whole]
            try:
                return Template(node).substitute({k: str(v) for k, v in values.items()})
            except (KeyError, ValueError) as exc:
                raise IsolationError(f"job template {template}: unknown placeholder {exc}") from None
        return node

    result: dict[str, Any] = fill(document)
    return result


def seconds(limit: str) -> int:
    """Slurm's `[D-]HH:MM:SS` time limit in seconds (the Job's activeDeadlineSeconds)."""
    days, _, clock = limit.rpartition("-")
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return total + int(days or 0) * 86400


class KubernetesProvider:
    name = "kubernetes"

    def __init__(self, isolation: IsolationConfig, clock: WallClock = WALL) -> None:
        self.config = isolation
        self.clock = clock  # queue waits and polls

    def job(self, rerun_id: str) -> dict[str, Any]:
        c = self.config
        assert c.job_template is not None  # the config requires it for kubernetes
        return render(
            c.job_template,
            {
                "RERUN_ID": rerun_id.lower(),
                "NAMESPACE": c.namespace,
                "IMAGE": c.image,
                "RUNNER_PORT": c.runner_port,
                "NODE_SELECTOR": dict(c.node_selector),
                "TOLERATIONS": [dict(t) for t in c.tolerations],
                "TLS_SECRET": c.tls_secret,
                "CONFIG_MAP": c.config_map,
                "ACTIVE_DEADLINE_S": seconds(c.time_limit),
            },
        )

    async def acquire(self, rerun_id: str) -> Placement:
        job = self.job(rerun_id)
        name = job["metadata"]["name"]
        async with self._client() as client:
            await _api(client.create(from_dict(job)))
            try:
                ip, node = await self._until_running(client, name)
            except BaseException:
                await self._delete(client, name)
                raise
        where = f"kubernetes job {self.config.namespace}/{name} on node {node}"
        return Placement(self.name, f"{ip}:{self.config.runner_port}", where, name)

    async def release(self, placement: Placement) -> None:
        async with self._client() as client:
            await self._delete(client, placement.handle)

    async def _until_running(self, client: AsyncClient, name: str) -> tuple[str, str]:
        deadline = self.clock.monotonic() + self.config.queue_wait_s
        while True:
            pod = await _api(_first_pod(client, name))
            status = pod.status if pod is not None else None
            phase = (status.phase if status is not None else None) or "Pending"
            if phase == "Running" and status is not None and status.podIP:
                node = pod.spec.nodeName if pod is not None and pod.spec is not None else None
                return status.podIP, node or "?"
            if phase in ("Succeeded", "Failed"):
                raise IsolationError(f"kubernetes job {name} ended before its runner came up ({phase})")
            if self.clock.monotonic() >= deadline:
                conditions = (status.conditions if status is not None else None) or []
                why = next((c.message for c in conditions if c.message), "")
                raise IsolationError(
                    f"kubernetes job {name} did not start within {self.config.queue_wait_s:g} s "
                    f"({phase}: {why or 'no reason given'}); it was deleted"
                )
            await self.clock.sleep(self.config.poll_s)

    async def _delete(self, client: AsyncClient, name: str) -> None:
        """Deletes the Job with its pods (background propagation) and waits, bounded, until it is gone."""
        namespace = self.config.namespace
        deadline = self.clock.monotonic() + GONE_S
        if not await _api(_missing_ok(client.delete(Job, name, namespace=namespace, cascade=CascadeType.BACKGROUND))):
            return
        while self.clock.monotonic() < deadline:
            if not await _api(_missing_ok(client.get(Job, name, namespace=namespace))):
                return
            await self.clock.sleep(self.config.poll_s)

    @asynccontextmanager
    async def _client(self) -> AsyncIterator[AsyncClient]:
        c = self.config
        cluster = Cluster(server=c.api_url, certificate_auth=str(c.ca_file) if c.ca_file else None)
        user = User(token_file=str(c.token_file)) if c.token_file is not None else None
        config = KubeConfig.from_one(cluster=cluster, user=user, namespace=c.namespace)
        client = AsyncClient(config, timeout=httpx.Timeout(30.0), trust_env=False)
        try:
            yield client
        finally:
            await client.close()


async def _first_pod(client: AsyncClient, job: str) -> Pod | None:
    """The Job's pod (Kubernetes labels it job-name=<job>), or None while it has none."""
    async for pod in client.list(Pod, labels={"job-name": job}):
        return pod
    return None


async def _missing_ok(call: Awaitable[Any]) -> bool:
    """Whether the object was there: a 404 is an answer here, not an error."""
    try:
        await call
    except httpx.HTTPStatusError as exc:  # ApiError, or a proxy's answer that is not a Status
        if exc.response.status_code == 404:
            return False
        raise
    return True


async def _api(call: Awaitable[T]) -> T:
    """The call's result; whatever the API or the network answered instead is one IsolationError line."""
    try:
        return await call
    except httpx.HTTPStatusError as exc:
        request = exc.request
        message = (exc.status.message or "") if isinstance(exc, ApiError) else exc.response.reason_phrase
        raise IsolationError(
            f"kubernetes API {request.method} {request.url.path}: {exc.response.status_code} {message}".rstrip()
        ) from None
    except (httpx.HTTPError, TimeoutError, ValueError) as exc:
        raise IsolationError(f"kubernetes API: {exc or type(exc).__name__}") from None
