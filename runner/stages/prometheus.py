"""Reading counters from a Prometheus text exposition (vLLM's /metrics)."""

from __future__ import annotations

import math
import re

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def counter_total(text: str, names: tuple[str, ...]) -> float | None:
    """The sum over all label sets of the first of `names` that the text has (names by vLLM version)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["name"] not in names:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if math.isfinite(value):
            totals[match["name"]] = totals.get(match["name"], 0.0) + value
    return next((totals[name] for name in names if name in totals), None)
