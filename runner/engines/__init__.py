"""Engine backends: how a `vllm serve` command is started, followed and stopped on this host."""

from __future__ import annotations

from runner.config import EngineConfig
from runner.engines.base import EngineBackend, LogLine, RunningEngine
from runner.engines.docker import DockerBackend
from runner.engines.kubernetes import KubernetesBackend
from runner.engines.process import ProcessBackend
from runner.engines.sim import SimBackend

__all__ = ["EngineBackend", "LogLine", "RunningEngine", "make_backend"]


def make_backend(config: EngineConfig) -> EngineBackend:
    if config.backend == "sim":
        return SimBackend(config.sim_scenario, config.sim_speed)
    if config.backend == "process":
        return ProcessBackend(executables=config.executables)
    if config.backend == "docker":
        return DockerBackend(config.docker)
    if config.backend == "kubernetes":
        return KubernetesBackend(config.kubernetes)
    raise ValueError(f"engine backend {config.backend!r} is not available on this runner")
