"""Picks the runner of a cluster that takes a run: reachable, serving the cluster, not busy, and of the right kind:
a runner labelled for isolated reruns (`isolated`, or the cluster's `[isolation] label`) takes only those."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc

from bot.config import BotConfig, ClusterConfig, IsolationConfig
from bot.runner_client import describe, rpc_error_text
from protos import runner_pb2 as pb

ISOLATED_LABEL = IsolationConfig.label  # runner.toml `labels = ["isolated"]`: a host kept for isolated reruns


class DispatchError(Exception):
    """No runner can take the run; the message says why for each runner."""


@dataclass(frozen=True)
class RunnerState:
    address: str
    description: pb.RunnerDescription | None
    error: str = ""

    @property
    def idle(self) -> bool:
        d = self.description
        return d is not None and len(d.active_run_ids) < max(d.max_concurrent_runs, 1)


async def survey(config: BotConfig, cluster: ClusterConfig) -> list[RunnerState]:
    """Asks every runner of the cluster at once; an unreachable runner is a state, not an exception."""

    async def ask(address: str) -> RunnerState:
        try:
            return RunnerState(address, await describe(address, config.tls, config.connect_timeout_s))
        except grpc.aio.AioRpcError as exc:
            return RunnerState(address, None, rpc_error_text(exc))

    return list(await asyncio.gather(*(ask(address) for address in cluster.runners)))


def isolation_labels(cluster: ClusterConfig) -> frozenset[str]:
    """The labels that keep a runner for isolated reruns: `isolated`, and the cluster's static isolation label."""
    return frozenset({ISOLATED_LABEL, cluster.isolation.label if cluster.isolation else ISOLATED_LABEL})


async def pick_runner(config: BotConfig, cluster: ClusterConfig, labels: tuple[str, ...] = ()) -> RunnerState:
    """The first runner of the cluster that can take a run now. `labels`: those it must carry (an isolated
    rerun's); without them the run is a regular one, which a runner kept for isolated reruns never takes, even
    when every other runner is down or busy. DispatchError says, in one line, why each runner could not."""
    states = await survey(config, cluster)
    reserved = isolation_labels(cluster)
    problems: list[str] = []
    for state in states:
        d = state.description
        if d is None:
            problems.append(f"{state.address} unreachable ({state.error})")
        elif d.cluster != cluster.name:
            problems.append(f"{state.address} serves cluster {d.cluster!r}")
        elif not set(labels) <= set(d.labels):
            problems.append(f"{state.address} lacks label(s) {', '.join(sorted(set(labels) - set(d.labels)))}")
        elif not labels and (kept := sorted(reserved & set(d.labels))):
            problems.append(f"{d.name} ({state.address}) {', '.join(kept)}: only for isolated reruns")
        elif not state.idle:
            problems.append(f"{d.name} busy with run {', '.join(d.active_run_ids)}")
        else:
            return state
    raise DispatchError(f"no runner of cluster {cluster.name} can take the run: {'; '.join(problems)}")
