"""Fault scenarios: the simulated host and model, and the faults to inject (TOML, validated up front).

A scenario's [host], [model] and [timings] override runner/sim/data/defaults.toml key by key; the
fields are documented in runner/sim/data/scenarios/healthy.toml. Faults carry an optional `when` table
so that later triggers (host facts, requests, flakiness) are new keys there, not a new format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, get_args, get_type_hints

from runner.sim.datafiles import load
from runner.toml_reader import ConfigError, read_toml
from runner.vllm_cli import LaunchCommandError, ServeCommand, flag_table

PHASES = ("gpu_detect", "weight_load", "engine_init", "api_listen", "request")
STARTUP_PHASES = PHASES[:-1]


@dataclass(frozen=True)
class Host:
    driver_version: str
    gpu_count: int
    gpu_name: str
    gpu_memory_gib: float
    foreign_memory_gib: float
    cuda_driver_version: int
    nccl_version: str


@dataclass(frozen=True)
class Model:
    architecture: str
    dtype: str
    weights_gib: float
    max_model_len: int
    kv_bytes_per_token: int
    kv_replicated: bool
    num_shards: int
    activation_gib: float
    cudagraph_gib: float
    moe_experts: int
    moe_intermediate_size: int
    attention_backend: str
    attention_backends: tuple[str, ...]
    reply_tokens: int
    reply_text: str
    chat_turn: str
    chat_generation_prompt: str


@dataclass(frozen=True)
class Timings:
    gpu_detect: float
    weight_load: float
    engine_init: float
    engine_init_eager: float
    api_listen: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    engine_death_exit: float
    stats_interval: float


@dataclass(frozen=True)
class When:
    """Conditions of a fault; all given ones must hold."""

    flag: str | None = None
    min_prompt_tokens: int | None = None

    def launch_matches(self, command: ServeCommand) -> bool:
        if self.flag is None:
            return True
        spec, wanted = flag_table().resolve(self.flag)
        given = command.value(spec.name)
        return given is not None if spec.kind != "bool" else given is wanted

    def request_matches(self, prompt_tokens: int) -> bool:
        return self.min_prompt_tokens is None or prompt_tokens >= self.min_prompt_tokens


@dataclass(frozen=True)
class Fault:
    phase: str
    error: str
    rank: int = 0
    when: When = field(default_factory=When)


@dataclass(frozen=True)
class Scenario:
    source: str
    description: str
    host: Host
    model: Model
    timings: Timings
    faults: tuple[Fault, ...]

    def check_ranks(self, tensor_parallel_size: int) -> None:
        """A fault on a rank the launch does not have is a scenario that cannot apply: say so."""
        for index, fault in enumerate(self.faults):
            if tensor_parallel_size > 1 and fault.rank >= tensor_parallel_size:
                raise ConfigError(
                    f"{self.source}: fault[{index}]: rank {fault.rank} but --tensor-parallel-size is "
                    f"{tensor_parallel_size}"
                )


_T = TypeVar("_T")
# quantities the simulator divides by or counts with
_POSITIVE = frozenset(
    {
        "gpu_count",
        "gpu_memory_gib",
        "max_model_len",
        "kv_bytes_per_token",
        "num_shards",
        "reply_tokens",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "stats_interval",
        "min_prompt_tokens",
    }
)


def builtin_scenarios() -> list[str]:
    """The names of the scenarios shipped in runner/sim/data/scenarios."""
    folder = resources.files("runner.sim").joinpath("data", "scenarios")
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def scenario_path(scenario: str, base: Path = Path()) -> Path:
    """A built-in scenario by name, or a scenario file (relative to `base`); ConfigError names the built-ins."""
    if "/" in scenario or scenario.endswith(".toml"):
        path = base / scenario
    else:
        path = Path(str(resources.files("runner.sim").joinpath("data", "scenarios", f"{scenario}.toml")))
    if not path.is_file():
        raise ConfigError(
            f"no sim scenario {scenario!r}: give a scenario file or one of {', '.join(builtin_scenarios())}"
        )
    return path.resolve()


def load_scenario(path: str | None, error_phases: Mapping[str, str]) -> Scenario:
    """The scenario at `path` (None: defaults, no faults); `error_phases` maps catalog keys to phases."""
    source = path or "(no scenario)"
    data = read_toml(Path(path)) if path else {}
    unknown = set(data) - {"description", "host", "model", "timings", "fault"}
    if unknown:
        raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r}")
    defaults = load("defaults.toml")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{source}: 'description' must be a string")
    faults = data.get("fault", [])
    if not isinstance(faults, list):
        raise ConfigError(f"{source}: 'fault' must be an array of tables ([[fault]])")
    return Scenario(
        source=source,
        description=description,
        host=_section(Host, defaults["host"], data.get("host", {}), f"{source}: [host]"),
        model=_section(Model, defaults["model"], data.get("model", {}), f"{source}: [model]"),
        timings=_section(Timings, defaults["timings"], data.get("timings", {}), f"{source}: [timings]"),
        faults=tuple(_fault(raw, error_phases, f"{source}: fault[{index}]") for index, raw in enumerate(faults)),
    )


def _section(cls: type[_T], defaults: Mapping[str, Any], overrides: Any, where: str) -> _T:
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where} must be a table")
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in {**defaults, **overrides}.items():
        if key not in hints:
            raise ConfigError(f"{where}: unknown key {key!r}")
        values[key] = _typed(value, hints[key], f"{where}: {key!r}")
        if isinstance(values[key], int | float) and not isinstance(values[key], bool):
            floor = "positive" if key in _POSITIVE else "non-negative"
            if values[key] < 0 or (values[key] == 0 and key in _POSITIVE):
                raise ConfigError(f"{where}: {key!r} must be {floor}, got {value!r}")
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]  # type: ignore[arg-type]
    missing = [name for name in required if name not in values]
    if missing:
        raise ConfigError(f"{where}: missing key {missing[0]!r}")
    return cls(**values)


def _typed(value: Any, kind: Any, where: str) -> Any:
    if isinstance(kind, UnionType):  # `X | None`: the key is optional, a given value must be an X
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    if kind == tuple[str, ...] and isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    raise ConfigError(f"{where} must be {names.get(kind, 'a list of strings')}, got {value!r}")


def _fault(raw: Any, error_phases: Mapping[str, str], where: str) -> Fault:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(raw) - {"phase", "error", "rank", "when"}
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    phase, error = raw.get("phase"), raw.get("error")
    if not isinstance(phase, str) or phase not in PHASES:
        raise ConfigError(f"{where}: phase must be one of {', '.join(PHASES)}, got {phase!r}")
    if not isinstance(error, str) or error not in error_phases:
        raise ConfigError(f"{where}: unknown error {error!r} (known: {', '.join(sorted(error_phases))})")
    if error_phases[error] != phase:
        raise ConfigError(f"{where}: error {error!r} happens in phase {error_phases[error]}, not {phase}")
    rank = _typed(raw.get("rank", 0), int, f"{where}: 'rank'")
    if rank < 0:
        raise ConfigError(f"{where}: 'rank' must be non-negative, got {rank}")
    return Fault(phase=phase, error=error, rank=rank, when=_when(raw.get("when", {}), phase, where))


def _when(raw: Any, phase: str, where: str) -> When:
    when = _section(When, {}, raw, f"{where}: [when]") if raw else When()
    if when.flag is not None:
        try:
            flag_table().resolve(when.flag)
        except (KeyError, LaunchCommandError):
            raise ConfigError(f"{where}: [when] flag {when.flag!r} is not a vllm serve flag") from None
    if when.min_prompt_tokens is not None and phase != "request":
        raise ConfigError(f"{where}: [when] min_prompt_tokens only applies to phase request")
    return when
