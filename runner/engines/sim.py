"""The simulator as an engine: the same process handling, with vllm-sim standing in for `vllm serve`."""

from __future__ import annotations

import sys
from importlib import resources

from runner.engines.process import ProcessBackend
from runner.vllm_cli import split_program


class SimBackend(ProcessBackend):
    name = "sim"

    def __init__(self, scenario: str, speed: float) -> None:
        self.scenario = _scenario_path(scenario) if scenario else ""
        self.speed = speed

    def environment(self, run_id: str) -> dict[str, str]:
        env = super().environment(run_id)
        env["VLLM_SIM_SPEED"] = str(self.speed)
        if self.scenario:
            env["VLLM_SIM_SCENARIO"] = self.scenario
        return env

    def command(self, argv: list[str]) -> list[str]:
        _, args = split_program(argv)
        return [sys.executable, "-m", "runner.sim", "serve", *args]


def _scenario_path(scenario: str) -> str:
    """A built-in scenario name (e.g. "demo") or a path to a scenario file."""
    if "/" in scenario or scenario.endswith(".toml"):
        return scenario
    return str(resources.files("runner.sim").joinpath("data", "scenarios", f"{scenario}.toml"))
