"""The runner's /metrics: what an operator of a GPU host alerts on, counted from the event stream.

Every event passes through EventLog.emit (runner/events.py), which hands it to `observe` once journaled, so
the numbers are those of the journal and the thread, and no stage counts anything itself.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kernel.launches import LaunchFold
from protos import runner_pb2 as pb
from protos.vocab import to_id

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Stage durations run from milliseconds (freeze, verdict) to the hour a 1T-parameter model takes to load.
STAGE_BUCKETS_S = (0.1, 1, 5, 15, 60, 300, 900, 1800, 3600, 7200, float("inf"))


class RunnerMetrics:
    def __init__(
        self,
        name: str,
        cluster: str,
        backend: str,
        journal: Path,
        active: Callable[[], int],
    ) -> None:
        self.registry = registry = CollectorRegistry()
        info = Gauge("k3repro_runner_info", "this runner (always 1)", ["name", "cluster", "backend"], registry=registry)
        info.labels(name, cluster, backend).set(1)
        self.runs = Counter(
            "k3repro_runner_runs_total",
            "runs finished, by status and decision",
            ["status", "decision"],
            registry=registry,
        )
        self.launches = Counter(
            "k3repro_runner_launches_total",
            "engine launches of finished runs: full, or a cheaper proxy (runner/data/proxies.toml)",
            ["kind"],
            registry=registry,
        )
        self.engine_seconds = Counter(
            "k3repro_runner_engine_alive_seconds_total",
            "engine time of finished runs' launches, from the launch to its last line or answer",
            ["kind"],
            registry=registry,
        )
        self.gpu_seconds = Counter(
            "k3repro_runner_engine_gpu_seconds_total",
            "engine time times the host's GPUs (a launch owns them all)",
            ["kind"],
            registry=registry,
        )
        self.gpus = 0  # set by the daemon from NVML when it starts (0: unknown, no GPU-seconds counted)
        gpus = Gauge("k3repro_runner_gpus", "GPUs NVML reported when the runner started", registry=registry)
        gpus.set_function(lambda: float(self.gpus))
        self.first_errors = Counter(
            "k3repro_runner_first_errors_total",
            "first errors found in engine logs, by phase and category",
            ["phase", "category"],
            registry=registry,
        )
        self.ladder_steps = Counter(
            "k3repro_runner_ladder_steps_total",
            "ladder steps, by step and outcome",
            ["step", "outcome"],
            registry=registry,
        )
        self.stages = Histogram(
            "k3repro_runner_stage_duration_seconds",
            "time each stage took, by stage and how it ended",
            ["stage", "status"],
            buckets=STAGE_BUCKETS_S,
            registry=registry,
        )
        journal_bytes = Gauge("k3repro_runner_journal_bytes", "size of the event journal on disk", registry=registry)
        journal_bytes.set_function(lambda: _size(journal))
        active_runs = Gauge("k3repro_runner_active_runs", "runs in progress", registry=registry)
        active_runs.set_function(lambda: float(active()))
        self._stage_started: dict[tuple[str, int], float] = {}
        self._launches: dict[str, LaunchFold] = {}  # run id -> the launches of the run so far

    def observe(self, event: pb.RunEvent) -> None:
        kind = event.WhichOneof("payload")
        at = event.at.ToNanoseconds() / 1e9
        self._launches.setdefault(event.run_id, LaunchFold()).apply(event)
        if kind == "stage_started":
            self._stage_started[(event.run_id, event.stage_started.stage)] = at
        elif kind == "stage_finished":
            done = event.stage_finished
            started = self._stage_started.pop((event.run_id, done.stage), None)
            if started is not None:
                stage, status = to_id(pb.Stage, done.stage), to_id(pb.StageStatus, done.status)
                self.stages.labels(stage, status).observe(max(0.0, at - started))
        elif kind == "first_error":
            error = event.first_error
            if not error.update:  # an update restates an error counted already (the wire says so)
                self.first_errors.labels(to_id(pb.Phase, error.phase), to_id(pb.ErrorCategory, error.category)).inc()
        elif kind == "ladder_step":
            step = event.ladder_step
            self.ladder_steps.labels(step.step, to_id(pb.LadderOutcome, step.outcome)).inc()
        elif kind == "run_finished":
            finished = event.run_finished
            status, decision = to_id(pb.RunStatus, finished.status), to_id(pb.Decision, finished.decision)
            self.runs.labels(status, decision or "none").inc()
            spans = self._launches.pop(event.run_id).spans
            proxies = sum(span.proxy for span in spans)
            self.launches.labels("full").inc(len(spans) - proxies)
            self.launches.labels("proxy").inc(proxies)
            for span in spans:
                kind, alive = "proxy" if span.proxy else "full", max(0.0, span.end - span.start)
                self.engine_seconds.labels(kind).inc(alive)
                self.gpu_seconds.labels(kind).inc(alive * self.gpus)
            for key in [key for key in self._stage_started if key[0] == event.run_id]:
                del self._stage_started[key]

    def app(self) -> web.Application:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        return app


def _size(journal: Path) -> float:
    """The journal with its write-ahead log (WAL mode: recent events are in the -wal file until a checkpoint)."""
    paths = (journal, journal.with_name(journal.name + "-wal"))
    return float(sum(path.stat().st_size for path in paths if path.exists()))
