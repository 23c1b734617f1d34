"""/metrics: the engine's statistics in Prometheus text format with vLLM's names and labels."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping

from runner.sim.datafiles import load
from runner.sim.engine import Engine

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value: float) -> str:
    """prometheus_client's floatToGoString: Go switches to exponents sooner than Python."""
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _labels(pairs: Mapping[str, object]) -> str:
    return ",".join(f'{key}="{value}"' for key, value in pairs.items())


class Metrics:
    def __init__(self, engine: Engine, model_name: str, values: dict[str, object]) -> None:
        self._engine = engine
        self._base: dict[str, object] = {"model_name": model_name, "engine": "0"}
        self._values = values
        self._created = time.time()

    def render(self) -> str:
        data = load("metrics.toml")
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
        out: list[str] = []
        for metric in data["metric"]:
            name, kind = metric["name"], metric["type"]
            out += [f"# HELP {name} {metric['help']}", f"# TYPE {name} {kind}"]
            value = stats[metric["value"]]
            if isinstance(value, Counter):  # one sample per value of the `by` label, zeros included
                series = [({**self._base, metric["by"]: label}, float(value[label])) for label in metric["values"]]
            else:
                series = [(self._base, float(value))]
            for labels, number in series:
                out.append(f"{name}{{{_labels(labels)}}} {_number(number)}")
                if kind == "counter":
                    created = name.removesuffix("_total") + "_created"
                    out.append(f"{created}{{{_labels(labels)}}} {_number(self._created)}")
        info = data["cache_config_info"]
        labels = {key: template.format(**self._values) for key, template in info["labels"].items()}
        out += [f"# HELP {info['name']} {info['help']}", f"# TYPE {info['name']} gauge"]
        out.append(f"{info['name']}{{{_labels(labels)}}} 1.0")
        return "\n".join(out) + "\n"
