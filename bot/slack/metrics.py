"""The bot's counters and gauges through prometheus_client, so the exposition (escaping included) is the
library's, not ours. Families are declared in bot/data/metrics.toml; each Metrics has its own registry."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from importlib import resources

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        text = resources.files("bot.data").joinpath("metrics.toml").read_text(encoding="utf-8")
        for spec in tomllib.loads(text)["metric"]:
            name, labels = spec["name"], spec.get("labels", [])
            if spec["type"] == "counter":
                self._counters[name] = Counter(name, spec["help"], labels, registry=self.registry)
            else:
                self._gauges[name] = Gauge(name, spec["help"], labels, registry=self.registry)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        counter = self._counters[name]
        (counter.labels(**labels) if labels else counter).inc(value)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        self._gauges[name].set_function(read)

    def render(self, extra: dict[str, float] | None = None) -> str:
        """The text exposition; `extra` sets gauges read only at scrape time (the outbox's queue)."""
        for name, number in (extra or {}).items():
            self._gauges[name].set(number)
        return generate_latest(self.registry).decode()
