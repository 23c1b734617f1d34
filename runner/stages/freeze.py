"""freeze: the read-only record of the failure scene, taken before anything is launched."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path
from typing import Any

from protos import runner_pb2 as pb
from runner.nvml import PynvmlSource
from runner.redact import redactor
from runner.stages.context import RunContext, StageResult

ENV_PREFIXES = ("CUDA_", "NCCL_", "VLLM_", "HF_", "NVIDIA_", "TORCH_", "PYTORCH_")


def host_facts() -> dict[str, Any]:
    return {"hostname": socket.gethostname(), "os": _os_name(), "kernel": platform.release()}


def _os_name() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key == "PRETTY_NAME":
                return value.strip().strip('"')
    except OSError:
        return None
    return None


def relevant_env() -> dict[str, str]:
    return redactor().env({k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)})


async def run(ctx: RunContext) -> StageResult:
    nvml = PynvmlSource().read()
    host = host_facts()
    scene: dict[str, Any] = {
        "host": host,
        "nvml": nvml.to_json(),
        "image": {"ref": ctx.request.image},
        "env": relevant_env(),
        "launch": {"argv": redactor().argv(ctx.command.argv())},
        "changes": [{"at": c.at, "what": redactor().line(c.what), "by": c.by} for c in ctx.request.changes],
    }
    await ctx.artifact("fingerprint", scene)
    if nvml.available:
        gpus = f"{len(nvml.gpus)} GPU(s)"
        await ctx.check(
            pb.CHECKLIST_ID_HOST_DRIVER_RECORDED,
            pb.CHECKLIST_STATE_HOLDS,
            f"driver {nvml.driver_version} (CUDA {nvml.cuda_driver_version}), {gpus}",
        )
        driver = f"driver {nvml.driver_version}, {gpus}"
    else:
        await ctx.check(pb.CHECKLIST_ID_HOST_DRIVER_RECORDED, pb.CHECKLIST_STATE_PENDING, nvml.error or "")
        driver = f"NVML unavailable ({nvml.error})"
    return StageResult(
        pb.STAGE_STATUS_OK,
        f"{host['hostname']} · {host['os']} · kernel {host['kernel']} · {driver} · image {ctx.request.image}",
    )
