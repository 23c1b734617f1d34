"""The facts rules need, read from a fingerprint: what actually loads first, declarations only as a fallback."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

Version = tuple[int, ...]
_REQUIRE_CUDA = re.compile(r"cuda>=(\d+(?:\.\d+)*)")


def version(text: str | None) -> Version | None:
    """`13.0.1` -> (13, 0, 1); None when it does not start with a number."""
    match = re.match(r"\d+(?:\.\d+)*", (text or "").strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else None


def shown(value: Version) -> str:
    return ".".join(map(str, value))


@dataclass(frozen=True)
class Sourced:
    """A version as written, and where it was read, for the rule's `actual`."""

    text: str
    source: str

    @property
    def value(self) -> Version:
        return version(self.text) or ()

    def __str__(self) -> str:
        return f"{self.text} ({self.source})"


def _sourced(text: str | None, source: str) -> Sourced | None:
    return Sourced(text.strip(), source) if text and version(text) else None


class Facts:
    def __init__(self, fingerprint: dict[str, Any]) -> None:
        self.nvml: dict[str, Any] = fingerprint.get("nvml") or {}
        self.image: dict[str, Any] | None = fingerprint.get("image")
        self.runtime: dict[str, Any] = fingerprint.get("runtime") or {}
        self.smi: dict[str, Any] = self.runtime.get("container_nvidia_smi") or {}

    def _host(self, nvml_key: str, smi_key: str) -> Sourced | None:
        if self.nvml.get("available"):
            return _sourced(self.nvml.get(nvml_key), "host NVML")
        if self.smi.get("available"):
            return _sourced(self.smi.get(smi_key), "nvidia-smi in the container")
        return None

    def driver(self) -> Sourced | None:
        return self._host("driver_version", "driver_version")

    def cuda_ceiling(self) -> Sourced | None:
        """The newest CUDA the host driver supports."""
        return self._host("cuda_driver_version", "cuda_version")

    def loaded_cuda(self) -> Sourced | None:
        """The CUDA runtime that loads: the newer of the runtime found by the probe and torch's build; the
        image's declared CUDA_VERSION / NVIDIA_REQUIRE_CUDA only when the probe could not tell."""
        probed = [
            found
            for found in (
                _sourced(self.runtime.get("cuda_runtime"), self.runtime.get("cuda_runtime_source") or "probe"),
                _sourced(self.runtime.get("torch_cuda"), "torch.version.cuda"),
            )
            if found
        ]
        if probed:
            return max(probed, key=lambda s: s.value)
        env = (self.image or {}).get("env") or {}
        required = _REQUIRE_CUDA.search(env.get("NVIDIA_REQUIRE_CUDA", ""))
        return _sourced(env.get("CUDA_VERSION"), "image env CUDA_VERSION") or (
            _sourced(required.group(1), "image env NVIDIA_REQUIRE_CUDA") if required else None
        )

    def gpus(self) -> tuple[list[str], str] | None:
        """GPU names and where they were read."""
        if self.nvml.get("available"):
            return [gpu.get("name", "") for gpu in self.nvml.get("gpus") or []], "host NVML"
        if self.smi.get("available"):
            return list(self.smi.get("gpus") or []), "nvidia-smi in the container"
        return None


def major_minor(value: Version) -> Version:
    return (*value, 0, 0)[:2]
