"""Isolation providers: where an isolated rerun gets a runner of its own (DESIGN §1, "Isolated rerun")."""

from __future__ import annotations

from bot.config import BotConfig, ClusterConfig
from bot.isolation.base import IsolationError, Placement, Provider
from bot.isolation.slurm import SlurmProvider
from bot.isolation.static import StaticProvider

__all__ = ["IsolationError", "Placement", "Provider", "make_provider"]


def make_provider(config: BotConfig, cluster: ClusterConfig) -> Provider:
    isolation = cluster.isolation
    if isolation is None:
        raise IsolationError(
            f"no isolation provider is configured for cluster {cluster.name} ([isolation] in the bot's config)"
        )
    if isolation.provider == "slurm":
        return SlurmProvider(isolation)
    if isolation.provider == "kubernetes":
        from bot.isolation.kubernetes import KubernetesProvider  # lightkube only where a cluster uses Kubernetes

        return KubernetesProvider(isolation)
    return StaticProvider(config, cluster, isolation)
