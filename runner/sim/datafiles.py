"""The simulator's TOML data under runner/sim/data, read once per process."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import resources
from typing import Any


@cache
def load(name: str) -> dict[str, Any]:
    """A data file by name, e.g. "errors.toml"."""
    text = resources.files("runner.sim").joinpath("data", name).read_text(encoding="utf-8")
    return tomllib.loads(text)
