"""What loads: the probe script (runner/data/probe.sh) and the `runtime` section built from its output.

The probe reads package metadata and files instead of importing torch, so it takes milliseconds, needs
no GPU, and reports what the install *would* load; it runs in a short-lived container of the image or
against a given Python.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections import defaultdict
from functools import cache
from importlib import resources
from typing import Any

PROBE_TIMEOUT_S = 60.0
_SMI_HEADER = re.compile(r"Driver Version:\s*(?P<driver>[\d.]+).*?CUDA Version:\s*(?P<cuda>[\d.]+)")
_SMI_GPU_ROW = re.compile(r"^\|\s+(?P<index>\d+)\s+(?P<name>\S.*?)\s+(?:On|Off)\s+\|")


@cache
def probe_script() -> str:
    return resources.files("runner.data").joinpath("probe.sh").read_text(encoding="utf-8")


def run_python_probe(python: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs the probe on this host against `python` (a bare-metal install), with `env` over our environment."""
    try:
        done = subprocess.run(
            ["sh", "-c", probe_script(), "probe", python],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            env={**os.environ, **env} if env else None,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return runtime_section("python", None, f"probe did not run: {exc}")
    runtime = runtime_section("python", done.stdout, None)
    if runtime["python"] is None:
        runtime["error"] = f"{python} is not a runnable Python"
    return runtime


def runtime_section(source: str, output: str | None, error: str | None) -> dict[str, Any]:
    """The fingerprint's `runtime` from the probe's `key=value` lines (None: the probe did not run)."""
    values: dict[str, list[str]] = defaultdict(list)
    for line in (output or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key].append(value)

    def one(key: str) -> str | None:
        return values[key][0] if values.get(key) else None

    return {
        "source": source,
        "python": one("python"),
        "python_path": one("python_path"),
        "vllm": one("vllm"),
        "torch": one("torch"),
        "torch_cuda": one("torch_cuda"),
        "transformers": one("transformers"),
        "cuda_runtime": one("cuda_runtime"),
        "cuda_runtime_source": one("cuda_runtime_source"),
        "nccl": one("nccl"),
        "cuda_compat": _compat(values) if values.get("compat_checked") else None,
        "container_nvidia_smi": _nvidia_smi(values) if values.get("nvidia_smi_rc") else None,
        "error": error,
    }


def _compat(values: dict[str, list[str]]) -> dict[str, Any]:
    via = sorted(set(values.get("compat_via", [])))
    return {
        "dirs": values.get("compat_dir", []),
        "driver": values["compat_driver"][0] if values.get("compat_driver") else None,
        "loaded": bool(via) and bool(values.get("compat_dir")),
        "via": via,
    }


def _nvidia_smi(values: dict[str, list[str]]) -> dict[str, Any]:
    """nvidia-smi as the container sees it: the driver and CUDA ceiling in its header, its GPU rows."""
    output = values.get("nvidia_smi", [])
    rc = int(values["nvidia_smi_rc"][0])
    header = next((m for m in map(_SMI_HEADER.search, output) if m), None)
    gpus = [m.group("name") for m in map(_SMI_GPU_ROW.match, output) if m]
    available = rc == 0 and header is not None
    error = None
    if rc == 127:
        error = "nvidia-smi not found"
    elif not available:
        error = next((line for line in output if line.strip()), f"nvidia-smi exited {rc}")
    return {
        "available": available,
        "driver_version": header.group("driver") if header else None,
        "cuda_version": header.group("cuda") if header else None,
        "gpu_count": len(gpus) if available else None,
        "gpus": gpus,
        "output": output,
        "error": error,
    }
