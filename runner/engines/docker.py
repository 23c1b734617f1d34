"""The docker engine: the launch command runs in a container of the (allowlisted) image, on the host network.

Containers carry the run id as a label, so stopping a run and cleaning up after a runner restart find every
container a run started. A container the engine refuses to create (no NVIDIA runtime for `--gpus all`, a
missing image) is reported the way `docker run` reports it, so the analyzer sees a container_init failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kernel.clock import Clock
from kernel.vllm_cli import split_program
from runner.config import DockerSettings
from runner.engines.base import LogLine
from runner.engines.fresh_caches import CONTAINER_ROOT, redirect
from runner.engines.lines import LineSplitter
from runner.fingerprint import ImageTarget
from runner.fingerprint.image import PROBE_LABEL, DockerUnavailable, docker_client, gpu_device_requests
from runner.nvml import NvmlSource, PynvmlSource
from runner.stacks.dump import OUTPUT_BYTES
from runner.stacks.summary import ProcessDump

RUN_LABEL = "k3repro.run_id"
DOCKER_RUN_EXIT = 125  # what `docker run` exits with when the daemon refuses the container
# The container's live processes, by pid: not the listing shell itself, nor a zombie (its exe link is gone).
LIVE_PIDS = 'for p in /proc/[0-9]*; do n=${p#/proc/}; [ "$n" != $$ ] && [ -e "$p/exe" ] && echo "$n"; done'


class DockerEngine:
    def __init__(self, container: Any | None, refusal: str = "") -> None:
        self._container = container
        self._refusal = refusal
        self._returncode: int | None = DOCKER_RUN_EXIT if container is None else None

    @property
    def returncode(self) -> int | None:
        return self._returncode

    @property
    def image_id(self) -> str:
        return str(self._container.attrs.get("Image") or "") if self._container is not None else ""

    async def lines(self) -> AsyncIterator[LogLine]:
        if self._container is None:
            yield LogLine("stderr", f"docker: Error response from daemon: {self._refusal}")
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[LogLine | None] = asyncio.Queue()
        threading.Thread(target=self._pump, args=(self._container, loop, queue), daemon=True).start()
        while (line := await queue.get()) is not None:
            yield line

    @staticmethod
    def _pump(container: Any, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[LogLine | None]) -> None:
        """Reads the container's merged output in a thread (the SDK's stream blocks) and hands over lines, each
        bounded (runner/engines/lines.py), in one call per chunk read."""
        splitter = LineSplitter()

        def hand_over(texts: list[str], stream: str = "stdout") -> None:
            if texts:
                loop.call_soon_threadsafe(_put_all, queue, [LogLine(stream, text) for text in texts])

        try:
            for chunk in container.logs(stream=True, follow=True, stdout=True, stderr=True):
                hand_over(splitter.feed(chunk))
        except Exception as exc:  # the container went away mid-stream: say so in the log
            hand_over(splitter.close())
            hand_over([f"[log stream ended: {exc}]"], "stderr")
        finally:
            hand_over(splitter.close())
            loop.call_soon_threadsafe(queue.put_nowait, None)

    async def wait(self) -> int:
        if self._container is not None and self._returncode is None:
            result = await asyncio.to_thread(self._container.wait)
            self._returncode = int(result.get("StatusCode", 1))
        return self._returncode if self._returncode is not None else DOCKER_RUN_EXIT

    async def dump_stacks(self, limit_s: float) -> list[ProcessDump]:
        """py-spy inside the container (`docker exec`) for each of its processes, when the image has py-spy (and
        the container may ptrace); otherwise one ProcessDump saying why not."""
        if self._container is None:
            return [ProcessDump(0, error="no container was started", label="container")]
        label = f"container {self._container.name}"
        try:  # one exec after another, each bounded by `timeout` inside the container
            return await asyncio.to_thread(self._dump_inside, limit_s, label)
        except Exception as exc:  # the daemon refused the exec (the container is gone): say so
            return [ProcessDump(0, error=f"docker exec failed: {_daemon_message(exc)}", label=label)]

    def _dump_inside(self, limit_s: float, label: str) -> list[ProcessDump]:
        container = self._container
        assert container is not None
        code, _ = container.exec_run(["sh", "-c", "command -v py-spy"])
        if code != 0:
            return [ProcessDump(0, error="py-spy is not installed in the image", label=label)]
        code, out = container.exec_run(["sh", "-c", LIVE_PIDS])
        pids = sorted(int(p) for p in out.decode().split() if p.isdigit()) if code == 0 else []
        dumps = []
        for pid in pids:
            code, out = container.exec_run(["timeout", f"{limit_s:.0f}", "py-spy", "dump", "--pid", str(pid)])
            text = out.decode("utf-8", "replace")[:OUTPUT_BYTES]
            if code == 0 and "\nThread " in f"\n{text}":
                dumps.append(ProcessDump(pid, text))
            else:
                reason = next((line for line in text.splitlines() if line.startswith("Error:")), f"exit {code}")
                dumps.append(ProcessDump(pid, error=reason.removeprefix("Error:").strip(), label=label))
        return dumps

    async def stop(self, grace_s: float) -> None:
        if self._container is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._container.stop, timeout=max(1, int(grace_s)))
        await self.wait()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._container.remove, force=True)


def _put_all(queue: asyncio.Queue[LogLine | None], lines: list[LogLine]) -> None:
    for line in lines:
        queue.put_nowait(line)


class DockerBackend:
    name = "docker"

    def __init__(self, settings: DockerSettings, nvml: NvmlSource | None = None) -> None:
        self.settings = settings
        self.nvml: NvmlSource = nvml or PynvmlSource()
        self.clock = Clock()  # a real engine in a container: the wall clock
        self._launches = 0

    def refusal(self, argv: list[str]) -> str:
        return ""  # the image (allowlisted) runs its own entrypoint; argv[0] is never run on the host

    def probe_target(self, argv: list[str], image: str) -> ImageTarget:
        return ImageTarget(image)

    async def launch(
        self, argv: list[str], *, run_id: str, image: str, fresh_caches: Path | None = None
    ) -> DockerEngine:
        """`docker run --network host --ipc host [--gpus all] IMAGE <args of vllm serve>`; the image's
        entrypoint is `vllm serve`, as in vLLM's images."""
        _, args = split_program(argv)
        self._launches += 1
        options: dict[str, Any] = {
            "command": args,
            "labels": {RUN_LABEL: run_id},
            "name": f"k3repro-{run_id}-{self._launches}",
            "network_mode": "host",
            "ipc_mode": "host",
            # fresh caches: paths inside the new container's own filesystem (runner/engines/fresh_caches.py)
            "environment": {**dict(self.settings.env), **(redirect(CONTAINER_ROOT) if fresh_caches else {})},
            "volumes": list(self.settings.volumes),
        }
        if self.settings.gpus:
            options["device_requests"] = gpu_device_requests()
        try:
            client = await asyncio.to_thread(docker_client)
            container = await asyncio.to_thread(client.containers.create, image, **options)
        except DockerUnavailable as exc:
            return DockerEngine(None, str(exc))
        except Exception as exc:  # the daemon's refusal is the finding, in its own words
            return DockerEngine(None, _daemon_message(exc))
        try:
            await asyncio.to_thread(container.start)
        except Exception as exc:  # e.g. `--gpus all` without the NVIDIA runtime: refused at start
            with contextlib.suppress(Exception):
                await asyncio.to_thread(container.remove, force=True)
            return DockerEngine(None, _daemon_message(exc))
        return DockerEngine(container)

    def scene_files(self) -> dict[str, str]:
        return {}

    def remove_leftovers(self, run_ids: set[str]) -> int:
        """Removes the containers of runs a previous runner process left unfinished."""
        try:
            client = docker_client()
        except DockerUnavailable:
            return 0
        removed = 0
        # one listing per label, no per-container inspect: a container that goes away meanwhile cannot fail
        # the clean-up. Freeze's image probe is a leftover too when a runner died during it (it lives seconds).
        leftovers = [
            c
            for c in client.api.containers(all=True, filters={"label": RUN_LABEL})
            if (c.get("Labels") or {}).get(RUN_LABEL) in run_ids
        ]
        leftovers += client.api.containers(all=True, filters={"label": f"{PROBE_LABEL}=1"})
        for container in leftovers:
            with contextlib.suppress(Exception):
                client.api.remove_container(container["Id"], force=True)
                removed += 1
        return removed


def _daemon_message(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip().splitlines()[0]
