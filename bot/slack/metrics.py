"""The bot's counters and gauges through prometheus_client, so the exposition (escaping included) is the
library's, not ours. Families are declared in bot/data/metrics.toml, read by the kernel's typed reader (a bad
row is named by file, row and key); each Metrics has its own registry."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kernel.toml_reader import packaged


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._counters: dict[str, Counter] = {}
        self._gauges: dict[str, Gauge] = {}
        for spec in packaged("metrics.toml", "bot.data").rows("metric"):
            spec.only(("name", "type", "help", "labels"))
            name, kind, help_text, labels = (
                spec.text("name"),
                spec.text("type"),
                spec.text("help"),
                spec.texts("labels"),
            )
            if kind == "counter":
                self._counters[name] = Counter(name, help_text, labels, registry=self.registry)
            elif kind == "gauge":
                self._gauges[name] = Gauge(name, help_text, labels, registry=self.registry)
            else:
                raise spec.fail(f"'type' must be counter or gauge, got {kind!r}")

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
