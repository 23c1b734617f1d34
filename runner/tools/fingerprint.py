"""`k3repro fingerprint [--image REF | --python PATH] [--json]`: this host's failure scene, as freeze records it."""

from __future__ import annotations

import argparse
import os
import shutil
from typing import Any

from kernel.fingerprint import to_text
from kernel.usage import CommandError
from runner.fingerprint import ImageTarget, PythonTarget, Target, collect
from runner.nvml import PynvmlSource


def target_of(args: argparse.Namespace) -> Target | None:
    if args.image:
        return ImageTarget(args.image)
    python = args.python or shutil.which("python3")
    if python is None:
        return None
    resolved = shutil.which(python)
    if resolved is None or not os.access(resolved, os.X_OK):
        raise CommandError(f"--python {python}: not an executable file")
    return PythonTarget(os.path.abspath(resolved))


def take(args: argparse.Namespace) -> dict[str, Any]:
    return collect(PynvmlSource(), target_of(args))


def run(args: argparse.Namespace) -> int:
    scene = take(args)
    print(to_text(scene) if args.json else summary(scene))
    return 0


def summary(scene: dict[str, Any]) -> str:
    host, nvml, image, runtime = scene["host"], scene["nvml"], scene["image"], scene["runtime"]
    lines = [f"host     {host['hostname']} · {host['os']} · kernel {host['kernel']}"]
    if nvml["available"]:
        names = sorted({g["name"] for g in nvml["gpus"]})
        lines.append(
            f"nvml     driver {nvml['driver_version']} · CUDA {nvml['cuda_driver_version']} · "
            f"{nvml['gpu_count']} x {', '.join(names) or 'no GPU'} · {len(nvml['processes'])} process(es) on GPUs"
        )
    else:
        lines.append(f"nvml     unavailable: {nvml['error']}")
    if image is not None:
        state = image["error"] or f"{image['id']} · digests {', '.join(image['repo_digests']) or 'none'}"
        lines.append(f"image    {image['ref']} · {state}")
    keys = ("python", "vllm", "torch", "torch_cuda", "cuda_runtime", "nccl", "transformers")
    lines.append(f"runtime  ({runtime['source']}) " + " · ".join(f"{k} {runtime[k] or '?'}" for k in keys))
    if runtime["error"]:
        lines.append(f"         {runtime['error']}")
    compat, smi = runtime["cuda_compat"], runtime["container_nvidia_smi"]
    if compat is not None:
        lines.append(f"compat   {'loaded via ' + ', '.join(compat['via']) if compat['loaded'] else 'not loaded'}")
    if smi is not None:
        seen = f"driver {smi['driver_version']} · CUDA {smi['cuda_version']}" if smi["available"] else smi["error"]
        lines.append(f"smi      {seen}")
    lines.append(f"env      {len(scene['env'])} variable(s) recorded, secrets redacted")
    lines.append(f"sha256   {scene['sha256']}")
    return "\n".join(lines)
