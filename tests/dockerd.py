"""A real Docker engine for tests, and vLLM-like images built locally (there is no registry here).

`dockerd --iptables=false --bridge=none` runs with its own data-root, exec-root, pidfile and socket under a
temporary folder and is stopped at the end of the session. Images are a busybox-static root file system
plus fake vLLM / torch / NCCL dist-info, /usr/local/cuda/version.json and an `nvidia-smi` script, brought
in with `docker import` and the env and labels vLLM's CUDA images carry. Containers need
`--network none`: there is no bridge.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker

from tests.procs import terminate

BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "sed", "head", "tr", "grep", "ls", "cat")
SITE = "usr/local/lib/python3.12/dist-packages"
SECRET_IN_IMAGE = "hf_abcdefghijklmnopqrstuvwxyz0123456789"

NVIDIA_SMI = """#!/bin/sh
cat <<'EOF'
Mon Nov 30 10:00:00 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI {driver}             Driver Version: {driver}     CUDA Version: {cuda}     |
|-----------------------------------------+------------------------+----------------------+
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |
|=========================================+========================+======================|
{rows}+-----------------------------------------------------------------------------------------+
EOF
"""
GPU_ROW = "|   {i}  NVIDIA GB300                   On  |   00000000:0{i}:00.0 Off |                    0 |\n"


@dataclass(frozen=True)
class FakeImage:
    """A vLLM-like image: what the probe should find inside it."""

    tag: str
    cuda: str = "13.0.1"
    torch_cuda: str = "13.0"
    vllm: str = "0.33.0"
    smi_driver: str = "580.65.06"
    smi_cuda: str = "13.0"
    compat_loaded: bool = False
    with_shell: bool = True
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def major_minor(self) -> str:
        return ".".join(self.cuda.split(".")[:2])

    @property
    def cuda_dir(self) -> str:
        return f"usr/local/cuda-{self.major_minor}"

    def env(self) -> dict[str, str]:
        major_minor = self.major_minor
        return {
            "PATH": "/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin",
            "CUDA_VERSION": self.cuda,
            "NV_CUDA_CUDART_VERSION": f"{major_minor}.96-1",
            "NVIDIA_REQUIRE_CUDA": f"cuda>={major_minor} brand=tesla,driver>=535,driver<536",
            "NVIDIA_VISIBLE_DEVICES": "all",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
            "LD_LIBRARY_PATH": "/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
            "VLLM_USAGE_SOURCE": "production-docker-image",
            "HF_TOKEN": SECRET_IN_IMAGE,
            **self.extra_env,
        }

    def files(self) -> dict[str, str]:
        cuda_dir = self.cuda_dir
        files = {
            f"{SITE}/vllm-{self.vllm}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {self.vllm}\n",
            f"{SITE}/vllm_flash_attn-9.9.9.dist-info/METADATA": "Name: vllm-flash-attn\nVersion: 9.9.9\n",
            f"{SITE}/torch-2.14.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.14.0\n",
            f"{SITE}/torch/version.py": f"__version__ = '2.14.0'\ncuda: Optional[str] = '{self.torch_cuda}'\n",
            f"{SITE}/transformers-4.60.0.dist-info/METADATA": "Name: transformers\nVersion: 4.60.0\n",
            f"{SITE}/nvidia_nccl_cu13-2.28.3.dist-info/METADATA": "Name: nvidia-nccl-cu13\nVersion: 2.28.3\n",
            f"{cuda_dir}/version.json": json.dumps(
                {
                    "cuda": {"name": "CUDA SDK", "version": self.cuda},
                    "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": f"{self.major_minor}.96"},
                },
                indent=3,
                separators=(",", " : "),
            ),
            f"{cuda_dir}/compat/libcuda.so.{self.smi_driver}": "not a library\n",
            "usr/local/bin/nvidia-smi": NVIDIA_SMI.format(
                driver=self.smi_driver, cuda=self.smi_cuda, rows="".join(GPU_ROW.format(i=i) for i in range(8))
            ),
        }
        if self.compat_loaded:
            files["etc/ld.so.conf.d/00-cuda-compat.conf"] = f"/{cuda_dir}/compat\n"
        return files

    def rootfs(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            if self.with_shell:
                tar.add(str(BUSYBOX), "bin/busybox")
                for applet in APPLETS:
                    _link(tar, f"bin/{applet}", "busybox")
            _link(tar, "usr/local/cuda", self.cuda_dir.removeprefix("usr/local/"))
            for name, text in self.files().items():
                data = text.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = 0o755 if name.endswith("nvidia-smi") else 0o644
                tar.addfile(info, io.BytesIO(data))
        return buffer.getvalue()


def _link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    tar.addfile(info)


IMAGES = (
    FakeImage("vllm/vllm-openai:kimi-k3"),
    FakeImage("vllm/vllm-openai:v0.33.0-cu132", cuda="13.2.0", torch_cuda="13.2"),
    FakeImage("vllm/vllm-openai:v0.19.0-cu129", cuda="12.9.1", torch_cuda="12.9", vllm="0.19.0"),
    FakeImage("vllm/vllm-openai:kimi-k3-compat", compat_loaded=True),
    FakeImage("vllm/vllm-openai:no-shell", with_shell=False),
)


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    labels: dict[str, str]


@dataclass
class Dockerd:
    url: str
    client: Any
    process: subprocess.Popen[bytes]
    root: Path

    def containers(self) -> list[ContainerInfo]:
        """Every container, from one listing: one removed meanwhile cannot fail it (the SDK's list() inspects
        each container afterwards, and a 404 there is a race, not a finding)."""
        return [ContainerInfo(c["Id"], c.get("Labels") or {}) for c in self.client.api.containers(all=True)]


@contextmanager
def running_dockerd() -> Iterator[Dockerd]:
    """Starts a private dockerd (fails loudly when Docker is not installed: `make setup` installs it)."""
    binary = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not Path(binary).exists() or not BUSYBOX.exists():
        raise RuntimeError("docker.io and busybox-static are needed for the docker tests; run `make setup`")
    root = Path(tempfile.mkdtemp(prefix="k3d-"))
    socket = root / "docker.sock"
    log = (root / "dockerd.log").open("wb")
    process = subprocess.Popen(
        [
            binary, "--iptables=false", "--bridge=none", "--ip-masq=false",
            f"--data-root={root / 'data'}", f"--exec-root={root / 'exec'}", f"--pidfile={root / 'dockerd.pid'}",
            f"--host=unix://{socket}",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"unix://{socket}"
    try:
        client = _wait_for(url, process, root)
        for image in IMAGES:
            repository, tag = image.tag.rsplit(":", 1)
            changes = [f'ENV {k}="{v}"' for k, v in image.env().items()]
            changes += ['LABEL maintainer="vLLM" org.opencontainers.image.version="0.33.0"']
            client.api.import_image_from_data(image.rootfs(), repository=repository, tag=tag, changes=changes)
        yield Dockerd(url, client, process, root)
    finally:
        terminate(process, 20)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(url: str, process: subprocess.Popen[bytes], root: Path) -> Any:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dockerd exited {process.returncode}: {(root / 'dockerd.log').read_text()[-2000:]}")
        try:
            client = docker.DockerClient(base_url=url, timeout=30)
            client.ping()
            return client
        except docker.errors.DockerException:
            time.sleep(0.1)
    raise RuntimeError(f"dockerd did not answer within 30 s: {(root / 'dockerd.log').read_text()[-2000:]}")
