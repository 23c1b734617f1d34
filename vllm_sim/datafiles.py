"""The simulator's TOML data under vllm_sim/data, read once per process."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any


@cache
def load(name: str) -> dict[str, Any]:
    """A data file by name, e.g. "errors.toml"."""
    text = resources.files("vllm_sim").joinpath("data", name).read_text(encoding="utf-8")
    return tomllib.loads(text)
