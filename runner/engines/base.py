"""The interface every engine backend offers to the stages."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kernel.clock import Clock
from runner.fingerprint import Target
from runner.nvml import NvmlSource
from runner.stacks.summary import ProcessDump


@dataclass(frozen=True)
class LogLine:
    stream: str  # "stdout" or "stderr"
    text: str


class RunningEngine(Protocol):
    @property
    def returncode(self) -> int | None: ...

    @property
    def image_id(self) -> str:
        """The image the engine runs, by id ("" without a container): a tag can move between launches."""
        ...

    def lines(self) -> AsyncIterator[LogLine]:
        """Every line the engine writes, both streams merged in arrival order, until both close."""
        ...

    async def wait(self) -> int: ...

    async def dump_stacks(self, limit_s: float) -> list[ProcessDump]:
        """The Python stack of each of the engine's processes (py-spy), taken within `limit_s` wall seconds; a
        process it cannot attach to is a ProcessDump with the reason, never an exception."""
        ...

    async def stop(self, grace_s: float) -> None:
        """Stops the engine and everything it started (its whole process group or container); `grace_s`
        is a limit of the backend's clock."""
        ...


class EngineBackend(Protocol):
    name: str
    nvml: NvmlSource  # what this backend's GPUs look like through NVML
    clock: Clock  # the engine's time: every wait on the engine counts it (kernel/clock.py)

    def refusal(self, argv: list[str]) -> str:
        """Why this backend will not run `argv` (one line), or "": checked before a run is recorded."""
        ...

    def probe_target(self, argv: list[str], image: str) -> Target | None:
        """What freeze probes for the versions that would load: the image, or the Python behind argv."""
        ...

    async def launch(
        self, argv: list[str], *, run_id: str, image: str, fresh_caches: Path | None = None
    ) -> RunningEngine:
        """Starts `argv`. With `fresh_caches` (a folder of the run's work dir on the runner's host), every cache of
        kernel/data/caches.toml is moved to a new, empty place for this launch alone (runner/engines/fresh_caches.py):
        under that folder for a process, inside the container's own filesystem for a container."""
        ...

    def remove_leftovers(self, run_ids: set[str]) -> int:
        """Stops whatever runs of a previous runner process left behind (leftovers cause secondary OOMs)."""
        ...

    def scene_files(self) -> dict[str, str]:
        """Files of the host the frozen scene carries beside the fingerprint, by artifact name (a simulated host's
        scenario); empty for a real host, whose scene the fingerprint is."""
        ...
