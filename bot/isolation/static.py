"""`static`: standing runners of the cluster that carry the isolation label (e.g. `labels = ["isolated"]`)."""

from __future__ import annotations

from bot.config import BotConfig, ClusterConfig, IsolationConfig
from bot.dispatcher import DispatchError, pick_runner
from bot.isolation.base import IsolationError, Placement


class StaticProvider:
    name = "static"

    def __init__(self, config: BotConfig, cluster: ClusterConfig, isolation: IsolationConfig) -> None:
        self.config = config
        self.cluster = cluster
        self.label = isolation.label

    async def acquire(self, rerun_id: str) -> Placement:
        try:
            state = await pick_runner(self.config, self.cluster, labels=(self.label,))
        except DispatchError as exc:
            raise IsolationError(f"no isolated runner: {exc}") from None
        name = state.description.name if state.description else state.address
        return Placement(self.name, state.address, f"runner {name} ({state.address}), labelled {self.label}")

    async def release(self, placement: Placement) -> None:
        """A standing runner stays up for the next rerun."""
