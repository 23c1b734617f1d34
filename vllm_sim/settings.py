"""What the simulator takes from `vllm serve`'s command line, with argparse's refusals.

The command is parsed by the project's own parser (kernel.vllm_cli), so the simulator accepts exactly
the flags the runner may pass; here the values vLLM would type-check are converted and checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass

from kernel.vllm_cli import ServeCommand
from vllm_sim.datafiles import load

_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT]?)")


class UsageError(Exception):
    """A command line vLLM's argparse refuses (exit code 2, usage line, `<prog>: error: <message>`)."""

    def __init__(self, message: str, *, prog: str = "vllm serve") -> None:
        super().__init__(message)
        self.prog = prog

    def text(self) -> str:
        cli = load("log.toml")["cli"]
        usage = cli["usage"] if self.prog == "vllm" else cli["serve_usage"]
        return f"{usage}\n{self.prog}: error: {self}\n"


@dataclass(frozen=True)
class Settings:
    command: ServeCommand
    model: str
    served_model_name: str
    host: str
    port: int
    tensor_parallel_size: int
    max_model_len: int | None  # None: the model's own context length
    auto_fit: bool  # --max-model-len -1 / auto
    enable_prefix_caching: bool
    block_size: int
    gpu_memory_utilization: float
    enforce_eager: bool
    max_num_seqs: int | None  # None: vLLM's default for the GPU
    max_num_batched_tokens: int | None
    kv_cache_dtype: str
    load_format: str
    trust_remote_code: bool
    quantization: str | None
    disable_log_stats: bool
    disable_access_log: bool
    non_default_args: dict[str, object]


def settings_from(command: ServeCommand, kv_cache_dtypes: Collection[str]) -> Settings:
    max_len = command.value("--max-model-len")
    auto_fit = isinstance(max_len, str) and max_len in ("-1", "auto")
    kv_cache_dtype = _text(command, "--kv-cache-dtype") or "auto"
    if kv_cache_dtype not in kv_cache_dtypes:
        choices = ", ".join(repr(c) for c in kv_cache_dtypes)
        raise UsageError(f"argument --kv-cache-dtype: invalid choice: {kv_cache_dtype!r} (choose from {choices})")
    quantization = _text(command, "--quantization")
    return Settings(
        command=command,
        model=command.model,
        served_model_name=command.served_model_name,
        host=_text(command, "--host") or "0.0.0.0",  # noqa: S104 - vLLM listens on all interfaces by default
        port=_port(command),
        tensor_parallel_size=_at_least_one(command, "--tensor-parallel-size"),
        max_model_len=None if auto_fit or max_len is None else _human_int(command, "--max-model-len"),
        auto_fit=auto_fit,
        enable_prefix_caching=command.value("--enable-prefix-caching") is not False,  # on by default in V1
        block_size=_int(command, "--block-size", 16),
        gpu_memory_utilization=_float(command, "--gpu-memory-utilization", 0.92),
        enforce_eager=command.value("--enforce-eager") is True,
        max_num_seqs=_int(command, "--max-num-seqs", 0) or None,
        max_num_batched_tokens=_human_int(command, "--max-num-batched-tokens") or None,
        kv_cache_dtype=kv_cache_dtype,
        load_format=_text(command, "--load-format") or "auto",
        trust_remote_code=command.value("--trust-remote-code") is True,
        quantization=quantization,
        disable_log_stats=command.value("--disable-log-stats") is True,
        disable_access_log=command.value("--disable-uvicorn-access-log") is True,
        non_default_args=_non_default_args(command),
    )


def _text(command: ServeCommand, name: str) -> str | None:
    value = command.value(name)
    return value if isinstance(value, str) else None


def _int(command: ServeCommand, name: str, default: int) -> int:
    value = _text(command, name)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        raise UsageError(f"argument {name}: invalid int value: {value!r}") from None
    if number < 0:
        raise UsageError(f"argument {name}: must not be negative, got {number}")
    return number


def _at_least_one(command: ServeCommand, name: str) -> int:
    number = _int(command, name, 1)
    if number < 1:
        raise UsageError(f"argument {name}: must be at least 1, got {number}")
    return number


def _port(command: ServeCommand) -> int:
    port = _int(command, "--port", 8000)
    if port > 65535:
        raise UsageError(f"argument --port: port must be 0-65535, got {port}")
    return port


def _float(command: ServeCommand, name: str, default: float) -> float:
    value = _text(command, name)
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        raise UsageError(f"argument {name}: invalid float value: {value!r}") from None


def _human_int(command: ServeCommand, name: str) -> int:
    """vLLM's human-readable ints: `32k` is 32000, `32K` is 32768 (decimal vs binary multipliers)."""
    value = _text(command, name)
    if value is None:
        return 0
    match = _HUMAN_INT.fullmatch(value)
    if not match:
        raise UsageError(f"argument {name}: invalid human_readable_int value: {value!r}")
    number, suffix = match.groups()
    power = " kmgt".index(suffix.lower()) if suffix else 0
    base = 1024 if suffix.isupper() else 1000
    result = int(float(number) * base**power)
    if result <= 0:
        raise UsageError(f"argument {name}: must be positive, got {value!r}")
    return result


def _non_default_args(command: ServeCommand) -> dict[str, object]:
    """The `non-default args: {...}` dict: typed like argparse would, frontend flags before the model, and
    the values vLLM hides (`--api-key`, `--hf-token`) as the '***' it prints."""
    cli = load("log.toml")["cli"]
    frontend, sensitive = set(cli["frontend_args"]), set(cli["sensitive_args"])
    early: dict[str, object] = {}
    late: dict[str, object] = {"model": command.model}
    for option in command.options:
        key = option.spec.name.removeprefix("--").replace("-", "_")
        value: object = option.value
        if key == "served_model_name":
            value = [option.value]
        elif option.spec.kind == "json" and isinstance(option.value, str):
            value = _json_value(option.value)
            if option.subkey:
                value = {option.subkey: value}
        elif isinstance(option.value, str):
            value = _number_or_text(option.value)
        if key in sensitive:
            value = "***"
        (early if key in frontend else late)[key] = value
    return {**early, **late}


def _json_value(text: str) -> object:
    try:
        parsed: object = json.loads(text)
    except ValueError:
        return text
    return parsed


def _number_or_text(text: str) -> object:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text
