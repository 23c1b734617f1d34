"""Fault scenarios (TOML, a contract): the failing deployment, the simulated host, and the faults to inject.

[deployment] is the deployment as the cluster runs it (the demo starts from it); [host] is what NVML and
nvidia-smi report; [image] is what a probe finds inside the image (its versions, nvidia-smi in a container); each [[fault]] strikes in a phase with an effect, when all of its [fault.when] conditions
hold, with a probability drawn from [host].seed and the launch number (so a flaky fault varies from attempt
to attempt and the same run replays the same way). [model] and [timings] are vllm-sim's own extension: they
override vllm_sim/data/defaults.toml key by key. vllm_sim/data/scenarios/healthy.toml documents every
key; unknown keys are refused, and only [deployment].command is required.
"""

from __future__ import annotations

import json
import random
import re
import shlex
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Any, TypeVar, get_args, get_type_hints

from kernel.fingerprint.caches import cache_specs
from kernel.toml_reader import ConfigError, read_toml, strict
from kernel.vllm_cli import FlagSpec, LaunchCommandError, flag_table, parse_launch_command
from vllm_sim.conditions import REQUEST_CONDITIONS, When, number, split_condition
from vllm_sim.datafiles import load
from vllm_sim.jit_cache import JitCache

PHASES = ("gpu_detect", "weight_load", "engine_init", "api_listen", "request")
STARTUP_PHASES = PHASES[:-1]
EFFECTS = ("crash", "hang", "error_response")
COLLECTIVES = ("all_reduce", "all_gather", "broadcast", "barrier")  # what a hung rank may wait in (fault `waits`)
_MIB_PER_GIB = 1024
_CATALOG_KEY = re.compile(r"[a-z0-9_]+")  # an error written like a catalog key is one (a typo is refused)


@dataclass(frozen=True)
class Deployment:
    argv: tuple[str, ...]
    image: str = ""
    request: Mapping[str, Any] | None = None  # the fixed request's body; None: the cluster's own

    @property
    def api(self) -> str:
        return "chat" if self.request is None or "messages" in self.request else "completions"


@dataclass(frozen=True)
class Host:
    driver_version: str
    cuda_driver_version: str  # the driver's CUDA ceiling as nvidia-smi shows it: "13.0"
    gpu_name: str
    gpu_count: int
    gpu_memory_mib: int
    foreign_memory_mib: int  # held on every GPU by other processes when a launch starts
    seed: int
    nccl_version: str

    @property
    def gpu_memory_gib(self) -> float:
        return self.gpu_memory_mib / _MIB_PER_GIB

    @property
    def foreign_memory_gib(self) -> float:
        return self.foreign_memory_mib / _MIB_PER_GIB

    @property
    def cuda_version_number(self) -> int:
        """The CUDA version the way torch prints it in its errors: "12.4" -> 12040."""
        major, minor = self.cuda_driver_version.split(".")
        return int(major) * 1000 + int(minor) * 10


@dataclass(frozen=True)
class Image:
    """What a probe finds inside the deployment's image: the versions it would load, and whether nvidia-smi
    runs in a container of it (the container's view of the host's GPUs)."""

    vllm: str
    torch: str
    torch_cuda: str  # the CUDA torch was built for, as torch/version.py says: "13.0"
    cuda_runtime: str  # the CUDA runtime the image ships: "13.0.88"
    nvidia_smi: bool  # false: the container sees no GPU (no device, no driver libraries mounted)


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
    weight_load_dummy: float  # --load-format dummy: random weights, no reading
    engine_init: float
    engine_init_eager: float
    api_listen: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    engine_death_exit: float
    stats_interval: float


@dataclass(frozen=True)
class Fault:
    id: str
    phase: str
    effect: str  # crash | hang | error_response
    error: str  # a key of vllm_sim/data/errors.toml, the text of the error, or "" for none
    traceback: bool = True
    probability: float = 1.0
    rank: int = 0
    when: When = field(default_factory=When)
    # A hang of a tensor-parallel launch: the collective `rank` is stuck in while the other ranks wait in the
    # shared-memory broadcast, as their processes' stacks show it (vllm_sim/workers/); "": no such processes.
    waits: str = ""

    def strikes(self, seed: int, launch: int, draw: int = 0) -> bool:
        """Whether the fault strikes at this launch (and its `draw`-th matching request): reproducible."""
        if self.probability >= 1.0:
            return True
        chance = random.Random(f"{seed}/{launch}/{self.id}/{draw}")
        return chance.random() < self.probability


@dataclass(frozen=True)
class Scenario:
    source: str
    description: str
    deployment: Deployment | None  # None only for the built-in defaults (no scenario file)
    host: Host
    image: Image
    model: Model
    timings: Timings
    faults: tuple[Fault, ...]
    jit_cache: JitCache | None = None  # a JIT kernel cache engine_init reads (vllm_sim/jit_cache.py)

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
        "gpu_memory_mib",
        "max_model_len",
        "kv_bytes_per_token",
        "num_shards",
        "reply_tokens",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "stats_interval",
        "prompt_tokens_min",
        "concurrency_min",
    }
)


def builtin_scenarios() -> list[str]:
    """The names of the scenarios shipped in vllm_sim/data/scenarios."""
    folder = resources.files("vllm_sim").joinpath("data", "scenarios")
    return sorted(entry.name.removesuffix(".toml") for entry in folder.iterdir() if entry.name.endswith(".toml"))


def scenario_path(scenario: str, base: Path = Path()) -> Path:
    """A built-in scenario by name, or a scenario file (relative to `base`); ConfigError names the built-ins."""
    if "/" in scenario or scenario.endswith(".toml"):
        path = base / scenario
    else:
        path = Path(str(resources.files("vllm_sim").joinpath("data", "scenarios", f"{scenario}.toml")))
    if not path.is_file():
        raise ConfigError(
            f"no sim scenario {scenario!r}: give a scenario file or one of {', '.join(builtin_scenarios())}"
        )
    return path.resolve()


def load_scenario(path: str | None, error_phases: Mapping[str, str]) -> Scenario:
    """The scenario at `path` (None: defaults, no faults); `error_phases` maps catalog keys to phases."""
    source = path or "(no scenario)"
    data = read_toml(Path(path)) if path else {}
    unknown = set(data) - {"description", "deployment", "host", "image", "model", "timings", "fault", "jit_cache"}
    if unknown:
        raise ConfigError(f"{source}: unknown key {sorted(unknown)[0]!r}")
    defaults = load("defaults.toml")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(f"{source}: 'description' must be a string")
    faults = data.get("fault", [])
    if not isinstance(faults, list):
        raise ConfigError(f"{source}: 'fault' must be an array of tables ([[fault]])")
    host = _section(Host, defaults["host"], data.get("host", {}), f"{source}: [host]")
    _check_host(host, f"{source}: [host]")
    parsed = tuple(_fault(raw, index, error_phases, f"{source}: fault[{index}]") for index, raw in enumerate(faults))
    ids = [fault.id for fault in parsed]
    if len(set(ids)) < len(ids):
        raise ConfigError(f"{source}: fault id {next(i for i in ids if ids.count(i) > 1)!r} is used twice")
    return Scenario(
        source=source,
        description=description,
        deployment=_deployment(data.get("deployment"), f"{source}: [deployment]") if path else None,
        host=host,
        image=_section(Image, defaults["image"], data.get("image", {}), f"{source}: [image]"),
        model=_section(Model, defaults["model"], data.get("model", {}), f"{source}: [model]"),
        timings=_section(Timings, defaults["timings"], data.get("timings", {}), f"{source}: [timings]"),
        faults=parsed,
        jit_cache=_jit_cache(data.get("jit_cache"), error_phases, f"{source}: [jit_cache]"),
    )


def _jit_cache(raw: Any, error_phases: Mapping[str, str], where: str) -> JitCache | None:
    if raw is None:
        return None
    reader = strict(raw, ("cache", "build", "errors", "left_by"), where)
    cache, errors = reader.text("cache"), tuple(reader.texts("errors", required=True))
    if cache not in {spec.name for spec in cache_specs()}:
        known = ", ".join(spec.name for spec in cache_specs())
        raise ConfigError(f"{where}: cache {cache!r} is not one of kernel/data/caches.toml's ({known})")
    for error in errors:
        if _CATALOG_KEY.fullmatch(error) and error not in error_phases:
            raise ConfigError(f"{where}: unknown error {error!r} (known: {', '.join(sorted(error_phases))})")
        if error_phases.get(error, "engine_init") != "engine_init":
            raise ConfigError(f"{where}: error {error!r} happens in {error_phases[error]}, not engine_init")
    return JitCache(cache, reader.text("build"), errors, reader.text("left_by", ""))


def _deployment(raw: Any, where: str) -> Deployment:
    if not isinstance(raw, dict) or "command" not in raw:
        raise ConfigError(f"{where}: missing key 'command' (the vllm serve command line the deployment runs)")
    unknown = set(raw) - {"command", "image", "request"}
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    command = raw["command"]
    if isinstance(command, str):
        argv = shlex.split(command)
    elif isinstance(command, list) and all(isinstance(token, str) for token in command):
        argv = list(command)
    else:
        raise ConfigError(f"{where}: 'command' must be the vllm serve command, as a string or a list")
    try:
        parse_launch_command(argv)
    except LaunchCommandError as exc:
        raise ConfigError(f"{where}: 'command': {exc}") from None
    image = raw.get("image", "")
    if not isinstance(image, str):
        raise ConfigError(f"{where}: 'image' must be a string")
    request = raw.get("request")
    if request is not None and (not isinstance(request, dict) or not ({"messages", "prompt"} & set(request))):
        raise ConfigError(f"{where}: 'request' must be a request body with messages (chat) or prompt (completions)")
    return Deployment(argv=tuple(argv), image=image, request=json.loads(json.dumps(request)) if request else None)


def _check_host(host: Host, where: str) -> None:
    if not re.fullmatch(r"\d+\.\d+", host.cuda_driver_version):
        raise ConfigError(f"{where}: 'cuda_driver_version' must read like \"13.0\", got {host.cuda_driver_version!r}")
    if not re.fullmatch(r"\d+(\.\d+)*", host.driver_version):
        raise ConfigError(f"{where}: 'driver_version' must read like \"580.65.06\", got {host.driver_version!r}")


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
    if (
        kind == tuple[tuple[str, str], ...]
        and isinstance(value, dict)
        and all(isinstance(v, str) for v in value.values())
    ):
        return tuple(value.items())
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    expected = names.get(kind, "a table of strings" if kind == tuple[tuple[str, str], ...] else "a list of strings")
    raise ConfigError(f"{where} must be {expected}, got {value!r}")


def _fault(raw: Any, index: int, error_phases: Mapping[str, str], where: str) -> Fault:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(raw) - {"id", "phase", "effect", "error", "traceback", "probability", "rank", "when", "waits"}
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    fault_id = _typed(raw.get("id", f"fault-{index}"), str, f"{where}: 'id'")
    error = _typed(raw.get("error", ""), str, f"{where}: 'error'")
    if _CATALOG_KEY.fullmatch(error) and error not in error_phases:
        raise ConfigError(
            f"{where}: unknown error {error!r} (known: {', '.join(sorted(error_phases))}; or the error's text)"
        )
    phase = raw.get("phase", error_phases.get(error, "request"))
    if not isinstance(phase, str) or phase not in PHASES:
        raise ConfigError(f"{where}: phase must be one of {', '.join(PHASES)}, got {phase!r}")
    if error in error_phases and error_phases[error] != phase:
        raise ConfigError(f"{where}: error {error!r} happens in phase {error_phases[error]}, not {phase}")
    effect = raw.get("effect", "crash")
    if effect not in EFFECTS:
        raise ConfigError(f"{where}: effect must be one of {', '.join(EFFECTS)}, got {effect!r}")
    if effect == "error_response" and phase != "request":
        raise ConfigError(f"{where}: effect error_response only applies to phase request")
    probability = _typed(raw.get("probability", 1.0), float, f"{where}: 'probability'")
    if not 0.0 <= probability <= 1.0:
        raise ConfigError(f"{where}: 'probability' must be between 0 and 1, got {probability}")
    rank = _typed(raw.get("rank", 0), int, f"{where}: 'rank'")
    if rank < 0:
        raise ConfigError(f"{where}: 'rank' must be non-negative, got {rank}")
    waits = _typed(raw.get("waits", ""), str, f"{where}: 'waits'")
    if waits and (effect != "hang" or waits not in COLLECTIVES):
        raise ConfigError(f"{where}: 'waits' takes a hang's collective, one of {', '.join(COLLECTIVES)}")
    return Fault(
        id=fault_id,
        phase=phase,
        effect=effect,
        error=error,
        traceback=_typed(raw.get("traceback", True), bool, f"{where}: 'traceback'"),
        probability=probability,
        rank=rank,
        when=_when(raw.get("when", {}), phase, f"{where}: [when]"),
        waits=waits,
    )


def _when(raw: Any, phase: str, where: str) -> When:
    when = _section(When, {}, raw, where) if raw else When()
    for flag in (*when.flags_present, *when.flags_absent, *(flag for flag, _ in when.flag_values)):
        _flag_spec(flag, where)
    for flag, condition in when.flag_values:
        if _flag_spec(flag, where).kind == "bool":
            raise ConfigError(f"{where}: flag_values: {flag} takes no value (use flags_present / flags_absent)")
        op, operand = split_condition(condition)
        if op not in ("==", "!=") and number(operand) is None:
            raise ConfigError(f"{where}: flag_values: {flag} = {condition!r} compares with {op}: give a number")
    if when.driver_below is not None and not re.fullmatch(r"\d+(\.\d+)*", when.driver_below):
        raise ConfigError(f"{where}: 'driver_below' must be a driver version like \"580\", got {when.driver_below!r}")
    request_only = [key for key in REQUEST_CONDITIONS if getattr(when, key) is not None]
    if request_only and phase != "request":
        raise ConfigError(f"{where}: {request_only[0]} only applies to phase request")
    return when


def _flag_spec(flag: str, where: str) -> FlagSpec:
    try:
        return flag_table().resolve(flag)[0]
    except (KeyError, LaunchCommandError):
        raise ConfigError(f"{where}: {flag!r} is not a vllm serve flag") from None
