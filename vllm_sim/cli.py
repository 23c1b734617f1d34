"""`vllm-sim serve MODEL [vllm serve flags]`: argument and environment checks, then the simulation.

Configuration comes from the command line (as for vLLM) and environment variables set by the runner's
sim backend: VLLM_SIM_SCENARIO (path of a fault scenario; none = a healthy host), VLLM_SIM_SPEED
(simulated seconds per wall-clock second, default 1) and VLLM_SIM_LAUNCH (which launch of the run this
is, default 0: flaky faults draw from the scenario's seed and this number).
"""

from __future__ import annotations

import asyncio
import os
import sys

from kernel.toml_reader import ConfigError
from kernel.vllm_cli import LaunchCommandError, parse_serve_args
from vllm_sim.catalog import catalog
from vllm_sim.datafiles import load
from vllm_sim.scenario import load_scenario
from vllm_sim.settings import Settings, UsageError, settings_from
from vllm_sim.simulator import simulate
from vllm_sim.sizing import compute_facts

SCENARIO_ENV = "VLLM_SIM_SCENARIO"
SPEED_ENV = "VLLM_SIM_SPEED"
LAUNCH_ENV = "VLLM_SIM_LAUNCH"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        settings = parse_settings(args)
    except UsageError as refused:
        sys.stderr.write(refused.text())
        return 2
    try:
        speed = _speed(os.environ.get(SPEED_ENV, "1"))
        launch = _launch(os.environ.get(LAUNCH_ENV, "0"))
        scenario = load_scenario(os.environ.get(SCENARIO_ENV) or None, catalog().phases())
        scenario.check_ranks(settings.tensor_parallel_size)
    except ConfigError as exc:
        sys.stderr.write(f"vllm-sim: {exc}\n")
        return 2
    return asyncio.run(simulate(compute_facts(settings, scenario, launch), speed))


def parse_settings(args: list[str]) -> Settings:
    """Parses like vLLM: the `vllm` parser owns the subcommand and unknown flags, `vllm serve` the rest."""
    subcommands = load("log.toml")["cli"]["subcommands"]
    if not args or args[0] != "serve":
        got = repr(args[0]) if args else "(none)"
        choices = ", ".join(repr(c) for c in subcommands)
        raise UsageError(f"argument subparser: invalid choice: {got} (choose from {choices})", prog="vllm")
    try:
        command = parse_serve_args(args[1:])
    except LaunchCommandError as exc:
        raise UsageError(str(exc), prog="vllm" if exc.unrecognized else "vllm serve") from None
    return settings_from(command, load("defaults.toml")["kv_cache_dtype_bytes"])


def _speed(text: str) -> float:
    try:
        speed = float(text)
    except ValueError:
        speed = 0.0
    if not speed > 0 or speed == float("inf"):
        raise ConfigError(f"{SPEED_ENV} must be a positive number, got {text!r}")
    return speed


def _launch(text: str) -> int:
    if not text.isdigit():
        raise ConfigError(f"{LAUNCH_ENV} must be a non-negative integer, got {text!r}")
    return int(text)
