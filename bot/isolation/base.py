"""What every isolation provider gives: a runner address for one rerun, and its release afterwards."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class IsolationError(Exception):
    """No isolated runner could be had (none configured, none free, a job that never started); one line."""


@dataclass(frozen=True)
class Placement:
    provider: str  # static | slurm | kubernetes
    address: str  # host:port of the isolated runner
    where: str  # for people: "slurm job 12 on node gpu-b7"
    handle: str = ""  # what release ends: a Slurm job id, a Kubernetes Job name; "" for a standing runner


class Provider(Protocol):
    name: str

    async def acquire(self, rerun_id: str) -> Placement:
        """A runner that serves this rerun, started if need be; IsolationError when there is none."""
        ...

    async def release(self, placement: Placement) -> None:
        """Ends what acquire started (safe to call when it has ended already); returns once it is gone."""
        ...
