"""Counters and gauges in Prometheus' text format, without a client library: the bot needs a handful."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

Labels = tuple[tuple[str, str], ...]

HELP = {
    "k3repro_slack_requests_total": ("counter", "slash commands and button clicks acknowledged, by answer"),
    "k3repro_slack_http_requests_total": ("counter", "HTTP requests to the Slack endpoint, by status"),
    "k3repro_slack_http_seconds_total": ("counter", "time spent answering the Slack endpoint (ack latency sum)"),
    "k3repro_slack_writes_total": ("counter", "Slack Web API writes by method and outcome"),
    "k3repro_slack_outbox_pending": ("gauge", "writes waiting in the outbox"),
    "k3repro_runs_followed": ("gauge", "runs whose thread the bot is following"),
}


class Metrics:
    def __init__(self) -> None:
        self._counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self._gauges: dict[str, Callable[[], float]] = {}

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self._counters[name][tuple(sorted(labels.items()))] += value

    def value(self, name: str, **labels: str) -> float:
        return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        self._gauges[name] = read

    def render(self, extra: dict[str, float] | None = None) -> str:
        lines: list[str] = []
        samples: dict[str, dict[Labels, float]] = {**self._counters}
        for name, read in self._gauges.items():
            samples[name] = {(): read()}
        for name, value in (extra or {}).items():
            samples[name] = {(): value}
        for name in sorted(samples):
            kind, text = HELP.get(name, ("untyped", name))
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            for labels, value in sorted(samples[name].items()):
                label_text = ",".join(f'{key}="{val}"' for key, val in labels)
                lines.append(f"{name}{{{label_text}}} {value:g}" if label_text else f"{name} {value:g}")
        return "\n".join(lines) + "\n"
