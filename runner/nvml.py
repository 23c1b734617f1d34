"""What NVML says about this host's GPUs, behind a small interface so a host without a GPU still answers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total_mib: int
    memory_used_mib: int


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    gpu_index: int
    used_memory_mib: int
    name: str


@dataclass(frozen=True)
class NvmlView:
    available: bool
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    processes: tuple[GpuProcess, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpu_count"] = len(self.gpus) if self.available else None
        data["gpus"] = [asdict(g) for g in self.gpus]
        data["processes"] = [asdict(p) for p in self.processes]
        return data


class NvmlSource(Protocol):
    def read(self) -> NvmlView: ...


class PynvmlSource:
    """The real NVML through nvidia-ml-py; any failure becomes `available: false` with the reason."""

    def read(self) -> NvmlView:
        try:
            import pynvml
        except ImportError as exc:
            return NvmlView(available=False, error=f"nvidia-ml-py is not installed: {exc}")
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return NvmlView(available=False, error=f"NVML init failed: {exc}")
        try:
            return _read_initialised(pynvml)
        except pynvml.NVMLError as exc:
            return NvmlView(available=False, error=f"NVML query failed: {exc}")
        finally:
            pynvml.nvmlShutdown()


def _read_initialised(pynvml: Any) -> NvmlView:
    cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
    gpus: list[GpuInfo] = []
    processes: list[GpuProcess] = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        gpus.append(
            GpuInfo(
                index=index,
                name=str(pynvml.nvmlDeviceGetName(handle)),
                uuid=str(pynvml.nvmlDeviceGetUUID(handle)),
                memory_total_mib=int(memory.total) // (1 << 20),
                memory_used_mib=int(memory.used) // (1 << 20),
            )
        )
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = proc.usedGpuMemory or 0
            processes.append(GpuProcess(proc.pid, index, int(used) // (1 << 20), _process_name(proc.pid)))
    return NvmlView(
        available=True,
        driver_version=str(pynvml.nvmlSystemGetDriverVersion()),
        cuda_driver_version=cuda_version_text(cuda),
        gpus=tuple(gpus),
        processes=tuple(processes),
    )


def cuda_version_text(cuda: int) -> str:
    """NVML's and torch's integer CUDA version as people write it: 13000 -> "13.0", 12090 -> "12.9"."""
    return f"{cuda // 1000}.{cuda % 1000 // 10}"


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return ""
