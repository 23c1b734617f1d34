"""Engine backends: how a `vllm serve` command is started, followed and stopped on this host."""

from __future__ import annotations

from runner.config import EngineConfig
from runner.engines.base import EngineBackend, LogLine, RunningEngine
from runner.engines.docker import DockerBackend
from runner.engines.kubernetes import KubernetesBackend
from runner.engines.process import ProcessBackend
from runner.plugins import engine_plugin

__all__ = ["EngineBackend", "LogLine", "RunningEngine", "make_backend"]


def make_backend(config: EngineConfig) -> EngineBackend:
    if config.backend == "process":
        return ProcessBackend(executables=config.executables)
    if config.backend == "docker":
        return DockerBackend(config.docker)
    if config.backend == "kubernetes":
        return KubernetesBackend(config.kubernetes)
    return engine_plugin(config.backend).make(config)  # the simulator's, outside the runner
