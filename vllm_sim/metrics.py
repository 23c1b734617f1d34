"""/metrics: the engine's statistics with vLLM's names and labels, exposed by prometheus_client as vLLM
exposes them (its `_total` and `_created` samples, number formatting and escaping included)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from vllm_sim.datafiles import load, reader
from vllm_sim.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class MetricSpec:
    """One [[metric]] row of vllm_sim/data/metrics.toml."""

    name: str
    type: str  # counter | gauge
    help: str
    value: str  # the engine statistic it reports
    by: str = ""  # the label of a statistic kept per value (a map)
    values: tuple[str, ...] = ()  # that label's values, each a sample even at zero


@cache
def metric_specs() -> tuple[MetricSpec, ...]:
    """The metric rows, read by the typed reader: a bad row is named by file, row and key at the first scrape."""
    specs = []
    for row in reader("metrics.toml").rows("metric"):
        row.only(("name", "type", "help", "value", "by", "values"))
        kind = row.text("type")
        if kind not in ("counter", "gauge"):
            raise row.fail(f"'type' must be counter or gauge, got {kind!r}")
        name, help_text, value = row.text("name"), row.text("help"), row.text("value")
        specs.append(MetricSpec(name, kind, help_text, value, row.text("by", ""), tuple(row.texts("values"))))
    return tuple(specs)


class Metrics(Collector):
    """Read from the engine at every scrape (a collector, not instruments the engine would have to update)."""

    def __init__(self, engine: Engine, model_name: str, values: dict[str, object]) -> None:
        self._engine = engine
        self._base = {"model_name": model_name, "engine": "0"}
        self._values = values
        self._created = time.time()
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(self)

    def render(self) -> str:
        return generate_latest(self._registry).decode()

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        stats: dict[str, float | Counter[str]] = {
            "running": engine.running,
            "waiting": engine.waiting,
            "kv_cache_usage": engine.kv_cache_usage(),
            "prefix_cache_queries": engine.cache.queries,
            "prefix_cache_hits": engine.cache.hits,
            "preemptions": 0,  # the simulated scheduler never runs out of KV blocks mid-request
            "prompt_tokens": engine.prompt_tokens,
            "generation_tokens": engine.generation_tokens,
            "request_success": engine.request_success,
        }
        for spec in metric_specs():
            value = stats[spec.value]
            by = [spec.by] if isinstance(value, Counter) else []
            family: CounterMetricFamily | GaugeMetricFamily
            if spec.type == "counter":
                family = CounterMetricFamily(spec.name, spec.help, labels=[*self._base, *by])
            else:
                family = GaugeMetricFamily(spec.name, spec.help, labels=[*self._base, *by])
            # a map gets one sample per value of the `by` label, zeros included
            series = [[label] for label in spec.values] if isinstance(value, Counter) else [[]]
            for extra in series:
                number = float(value[extra[0]]) if isinstance(value, Counter) else float(value)
                if isinstance(family, CounterMetricFamily):
                    family.add_metric([*self._base.values(), *extra], number, created=self._created)
                else:
                    family.add_metric([*self._base.values(), *extra], number)
            yield family
        info = load("metrics.toml")["cache_config_info"]
        labels = {key: template.format(**self._values) for key, template in info["labels"].items()}
        cache = GaugeMetricFamily(info["name"], info["help"], labels=list(labels))
        cache.add_metric(list(labels.values()), 1.0)
        yield cache
