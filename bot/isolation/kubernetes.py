"""`kubernetes`: one Job per rerun from the template in deploy/k8s/, placed by node selector and tolerations,
started and removed through the Kubernetes API (a thin aiohttp client: a POST, a few GETs, a DELETE)."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from pathlib import Path
from string import Template
from typing import Any
from urllib.parse import quote

import aiohttp

from bot.config import IsolationConfig
from bot.isolation.base import IsolationError, Placement

GONE_S = 30.0


def render(template: Path, values: dict[str, Any]) -> dict[str, Any]:
    """The template (JSON) with `${NAME}` filled in; a string that is only `${NAME}` takes the value as it is
    (a number, a table, a list), so structure is never built from text."""
    try:
        document = json.loads(template.read_text())
    except (OSError, ValueError) as exc:
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

    def __init__(self, isolation: IsolationConfig) -> None:
        self.config = isolation

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
        async with self._session() as http:
            await self._call(http, "POST", f"/apis/batch/v1/namespaces/{self.config.namespace}/jobs", job)
            try:
                ip, node = await self._until_running(http, name)
            except BaseException:
                await self._delete(http, name)
                raise
        where = f"kubernetes job {self.config.namespace}/{name} on node {node}"
        return Placement(self.name, f"{ip}:{self.config.runner_port}", where, name)

    async def release(self, placement: Placement) -> None:
        async with self._session() as http:
            await self._delete(http, placement.handle)

    async def _until_running(self, http: aiohttp.ClientSession, name: str) -> tuple[str, str]:
        deadline = time.monotonic() + self.config.queue_wait_s
        selector = quote(f"job-name={name}")
        while True:
            pods = await self._call(
                http, "GET", f"/api/v1/namespaces/{self.config.namespace}/pods?labelSelector={selector}"
            )
            pod = (pods.get("items") or [{}])[0]
            status = pod.get("status", {})
            phase = status.get("phase", "Pending")
            if phase == "Running" and status.get("podIP"):
                return status["podIP"], pod.get("spec", {}).get("nodeName", "?")
            if phase in ("Succeeded", "Failed"):
                raise IsolationError(f"kubernetes job {name} ended before its runner came up ({phase})")
            if time.monotonic() >= deadline:
                why = next((c.get("message") for c in status.get("conditions", []) if c.get("message")), "")
                raise IsolationError(
                    f"kubernetes job {name} did not start within {self.config.queue_wait_s:g} s "
                    f"({phase}: {why or 'no reason given'}); it was deleted"
                )
            await asyncio.sleep(self.config.poll_s)

    async def _delete(self, http: aiohttp.ClientSession, name: str) -> None:
        path = f"/apis/batch/v1/namespaces/{self.config.namespace}/jobs/{name}"
        await self._call(http, "DELETE", path, {"propagationPolicy": "Background"}, missing_ok=True)
        deadline = time.monotonic() + GONE_S
        while True:
            if not await self._call(http, "GET", path, missing_ok=True) or time.monotonic() >= deadline:
                return
            await asyncio.sleep(self.config.poll_s)

    def _session(self) -> aiohttp.ClientSession:
        c = self.config
        headers = {"Accept": "application/json"}
        if c.token_file is not None:
            headers["Authorization"] = f"Bearer {c.token_file.read_text().strip()}"
        context = ssl.create_default_context(cafile=str(c.ca_file)) if c.ca_file else None
        return aiohttp.ClientSession(
            base_url=c.api_url,
            headers=headers,
            connector=aiohttp.TCPConnector(ssl=context) if context else None,
            timeout=aiohttp.ClientTimeout(total=30),
        )

    async def _call(
        self, http: aiohttp.ClientSession, method: str, path: str, body: Any = None, *, missing_ok: bool = False
    ) -> dict[str, Any]:
        try:
            async with http.request(method, path, json=body) as response:
                if response.status == 404 and missing_ok:
                    return {}
                payload = await response.json(content_type=None)
                if response.status >= 300:
                    message = payload.get("message", "") if isinstance(payload, dict) else ""
                    raise IsolationError(f"kubernetes API {method} {path}: {response.status} {message}".rstrip())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise IsolationError(f"kubernetes API {method} {path}: {exc or type(exc).__name__}") from None
        result: dict[str, Any] = payload
        return result
