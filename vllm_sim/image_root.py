"""The deployment's image as the freeze probe sees it: a folder holding the files runner/data/probe.sh reads
(package metadata, torch/version.py, CUDA's version.json) and an nvidia-smi that answers the way a container of
the image would on the simulated host. The probe runs unchanged against it; only its environment points there."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import tempfile
from pathlib import Path

from vllm_sim.scenario import Host, Image

SITE = "site-packages"  # the probe finds packages in sys.path entries ending in -packages (PYTHONPATH first)
NO_DEVICE = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
NO_DEVICE += "latest NVIDIA driver is installed and running."


def probe_environment(image: Image, host: Host) -> dict[str, str]:
    """What the probe's environment needs to read the simulated image (the folder is made once per image)."""
    files = _files(image, host)
    digest = hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / "k3repro-sim-image" / digest
    if not root.is_dir():
        _write(root, files)
    return {
        "PYTHONPATH": str(root / SITE),
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "CUDA_HOME": str(root / "cuda"),
    }


def _files(image: Image, host: Host) -> dict[str, str]:
    metadata = "Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    cuda = {"cuda": {"name": "CUDA SDK", "version": image.cuda_runtime}}
    return {
        f"{SITE}/vllm-{image.vllm}.dist-info/METADATA": metadata.format(name="vllm", version=image.vllm),
        f"{SITE}/torch-{image.torch}.dist-info/METADATA": metadata.format(name="torch", version=image.torch),
        f"{SITE}/torch/version.py": f"__version__ = '{image.torch}'\ncuda: str = '{image.torch_cuda}'\n",
        f"{SITE}/nvidia_nccl_cu13-{host.nccl_version}.dist-info/METADATA": metadata.format(
            name="nvidia-nccl-cu13", version=host.nccl_version
        ),
        "cuda/version.json": json.dumps(cuda),
        "bin/nvidia-smi": _nvidia_smi(image, host),
    }


def _nvidia_smi(image: Image, host: Host) -> str:
    if not image.nvidia_smi:
        return f"#!/bin/sh\necho {shlex.quote(NO_DEVICE)}\nexit 9\n"
    rule = "+" + "-" * 89 + "+"
    header = f"| NVIDIA-SMI {host.driver_version:<22} Driver Version: {host.driver_version:<14} CUDA Version: "
    header += f"{host.cuda_driver_version:<9}|"
    rows = [
        f"| {index:>3}  {host.gpu_name:<30}  On  |   00000000:{index + 0x18:02X}:00.0 Off |                    0 |"
        for index in range(host.gpu_count)
    ]
    table = "\n".join([rule, header, rule, *rows, rule])
    return f"#!/bin/sh\ncat <<'SMI'\n{table}\nSMI\n"


def _write(root: Path, files: dict[str, str]) -> None:
    """Writes the folder beside its place and renames it in: concurrent runs never see half of it."""
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root.parent))
    for name, text in files.items():
        path = staging / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (staging / "bin" / "nvidia-smi").chmod(0o755)
    try:
        staging.rename(root)
    except OSError:  # another run made it first: theirs is the same
        for path in sorted(staging.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        staging.rmdir()
