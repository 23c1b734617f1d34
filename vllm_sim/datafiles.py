"""The simulator's TOML data under vllm_sim/data, read once per process through the kernel's typed reader (a
bad row is named by file, row and key, like every other data file's)."""

from __future__ import annotations

from functools import cache
from typing import Any

from kernel.toml_reader import TomlReader, packaged


@cache
def reader(name: str) -> TomlReader:
    """A data file by name, e.g. "errors.toml", as a typed reader (origin `vllm_sim/data/NAME`)."""
    return packaged(name, "vllm_sim.data")


def load(name: str) -> dict[str, Any]:
    """A data file's raw tables, for free-form text tables (log lines, templates) read by key."""
    return reader(name).data
