"""The simulator as an engine: the same process handling, with vllm-sim standing in for `vllm serve`, and the
scenario's [host] standing in for NVML, so no stage knows it talks to the simulator."""

from __future__ import annotations

import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from kernel.clock import Clock
from kernel.toml_reader import ConfigError
from kernel.vllm_cli import split_program
from runner.config import EngineConfig
from runner.engines.process import ProcessBackend, ProcessEngine
from runner.fingerprint import PythonTarget
from runner.nvml import GpuInfo, GpuProcess, NvmlView
from vllm_sim.catalog import catalog
from vllm_sim.cli import parse_settings
from vllm_sim.image_root import probe_environment
from vllm_sim.scenario import Deployment, Host, load_scenario, scenario_path
from vllm_sim.settings import UsageError

FOREIGN_PID = 4242  # the simulated leftover process holding memory on every GPU


@dataclass(frozen=True)
class SimEngine:
    """A launched simulator and what it holds on the GPUs while it lives (vLLM reserves its share up front)."""

    engine: ProcessEngine
    gpus: int  # --tensor-parallel-size
    utilization: float  # --gpu-memory-utilization


class ScenarioNvml:
    """NVML as the simulated host would answer it: the scenario's [host] facts, plus what the simulators this
    backend launched hold while they live."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.engines: list[SimEngine] = []
        self._host: tuple[tuple[int, int], Host] | None = None  # the [host] last read, by the file's (mtime, size)

    def read(self) -> NvmlView:
        try:
            host = self._read_host()
        except (ConfigError, OSError) as exc:
            return NvmlView(available=False, error=f"NVML init failed: {exc}")
        foreign = host.foreign_memory_mib
        alive = [e for e in self.engines if e.engine.returncode is None]  # read in a worker thread: no writes
        held = [
            GpuProcess(e.engine.pid, index, int(host.gpu_memory_mib * e.utilization), "python3")
            for e in alive
            for index in range(min(e.gpus, host.gpu_count))
        ]
        gpus = tuple(
            GpuInfo(
                index=index,
                name=host.gpu_name,
                uuid=f"GPU-{index:08x}-0000-4000-8000-000000000000",
                memory_total_mib=host.gpu_memory_mib,
                memory_used_mib=foreign + sum(p.used_memory_mib for p in held if p.gpu_index == index),
            )
            for index in range(host.gpu_count)
        )
        foreign_processes = [GpuProcess(FOREIGN_PID, gpu.index, foreign, "python3") for gpu in gpus if foreign]
        processes = (*foreign_processes, *held)
        return NvmlView(
            available=True,
            driver_version=host.driver_version,
            cuda_driver_version=host.cuda_driver_version,
            gpus=gpus,
            processes=processes,
        )

    def _read_host(self) -> Host:
        """The scenario's [host], parsed again only when the file changed (every request reads NVML twice; a
        host can still change under a run, as a driver upgrade would)."""
        if not self.scenario:
            return load_scenario(None, catalog().phases()).host
        stat = os.stat(self.scenario)
        stamp = (stat.st_mtime_ns, stat.st_size)
        if self._host is None or self._host[0] != stamp:
            self._host = (stamp, load_scenario(self.scenario, catalog().phases()).host)
        return self._host[1]


class SimBackend(ProcessBackend):
    name = "sim"

    def __init__(self, scenario: str, speed: float) -> None:
        self.scenario = scenario  # a resolved path (runner.toml's loader resolves names), or "" for healthy
        self.speed = speed
        self._launches: Counter[str] = Counter()  # per run: a flaky scenario replays the same way in each run
        self._nvml = ScenarioNvml(self.scenario)
        super().__init__(self._nvml, clock=Clock.scaled(speed))  # the simulator's time is the runner's

    async def launch(
        self, argv: list[str], *, run_id: str, image: str, fresh_caches: Path | None = None
    ) -> ProcessEngine:
        engine = await super().launch(argv, run_id=run_id, image=image, fresh_caches=fresh_caches)
        try:
            settings = parse_settings(self.command(argv)[3:])  # read the way the simulator reads it
        except UsageError:
            return engine  # refused: the simulator exits at once and holds nothing
        alive = [e for e in self._nvml.engines if e.engine.returncode is None]
        held = SimEngine(engine, settings.tensor_parallel_size, settings.gpu_memory_utilization)
        self._nvml.engines = [*alive, held]  # one assignment: a concurrent read sees the old list or the new
        return engine

    def refusal(self, argv: list[str]) -> str:
        return ""  # argv[0] is never run: the simulator stands in for it

    def probe_target(self, argv: list[str], image: str) -> PythonTarget:
        """The Python that runs vllm-sim, seeing the scenario's [image] as the probe would inside it."""
        scenario = load_scenario(self.scenario or None, catalog().phases())
        env = probe_environment(scenario.image, scenario.host)
        return PythonTarget(sys.executable, tuple(sorted(env.items())))

    def environment(self, run_id: str) -> dict[str, str]:
        env = super().environment(run_id)
        env["VLLM_SIM_SPEED"] = str(self.speed)
        self._launches[run_id] += 1
        env["VLLM_SIM_LAUNCH"] = str(self._launches[run_id])
        if self.scenario:
            env["VLLM_SIM_SCENARIO"] = self.scenario
        return env

    def scene_files(self) -> dict[str, str]:
        """The simulated host is part of the scene: a frozen bundle of a sim run carries its scenario."""
        return {"sim_scenario": Path(self.scenario).read_text(encoding="utf-8")} if self.scenario else {}

    def command(self, argv: list[str]) -> list[str]:
        _, args = split_program(argv)
        return [sys.executable, "-m", "vllm_sim", "serve", *args]


class SimPlugin:
    """What the runner and the demo ask of the simulator, through the entry point `k3repro.engines: sim`:
    neither names a module of it."""

    name = "sim"

    def scenario(self, name: str, base: Path = Path()) -> str:
        """A scenario by built-in name or file, resolved and read once (a broken one is refused now)."""
        path = scenario_path(name, base)
        load_scenario(str(path), catalog().phases())
        return str(path)

    def deployment(self, scenario: str) -> Deployment:
        """The scenario's deployment as its cluster runs it (every scenario file has one)."""
        deployment = load_scenario(scenario, catalog().phases()).deployment
        if deployment is None:
            raise ConfigError(f"{scenario}: no [deployment]")
        return deployment

    def make(self, config: EngineConfig) -> SimBackend:
        return SimBackend(config.sim_scenario, config.sim_speed)


PLUGIN = SimPlugin()
