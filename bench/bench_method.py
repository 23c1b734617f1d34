"""Launches and simulated GPU-minutes to a verdict, for every shipped scenario: the proxy plan, today's plan
without proxies, and a naive plan.

Each scenario runs the way `k3repro demo --scenario NAME --json` runs it (its [deployment] on the sim
backend), twice: as the method ships (proxy launches, runner/data/proxies.toml) and with `[engine] proxies =
false`. The naive plan is the method without reuse or proxies: every ladder step that was tested relaunches the
engine, and each step is launched on its own; its figures are derived from the no-proxy run. Two cost models:
- per launch: one full load of a 1T-parameter model takes LOAD_MINUTES on the node's GPUS GPUs, whatever
  happens to the launch; a proxy launch costs that scaled by its own measured start-up against the run's full
  launches' (the simulator loads dummy weights in its scenario's weight_load_dummy seconds);
- measured: the simulated seconds each engine of the run was alive (first to last line of its log, the stop
  included), times GPUS. The naive plan's extra launches each cost a full start-up of the scenario's model
  (a launch the baseline prevented: its gpu_detect phase), and its hangs last until vLLM's own start-up
  timeout (VLLM_ENGINE_READY_TIMEOUT_S) instead of the runner's stall limit. The measured figure includes
  the runner's own overhead, scaled by the sim speed.
The minimize columns: `k3repro minimize` after the proxy plan's run, where its ladder named a trigger: the
1-minimal failing flag set it found, its launches (proxies weighted as above) and GPU-minutes both ways.
Run: `.venv/bin/python bench/bench_method.py`.
"""

from __future__ import annotations

import asyncio
import io
import re
import tempfile
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.store import Store
from demo.run import demo
from protos import runner_pb2 as pb
from vllm_sim.catalog import catalog
from vllm_sim.scenario import builtin_scenarios, load_scenario, scenario_path

LOAD_MINUTES = 15
GPUS = 8
SPEED = 100  # where the demo's stall limit is still 300 simulated seconds
STALL_S = 300.0  # bot/data/demo.toml's stall_timeout_s (simulated)
VLLM_READY_TIMEOUT_S = 600.0  # what vLLM itself waits for its engine to come up
STAMP = re.compile(r" (\d\d-\d\d \d\d:\d\d:\d\d) \[")


async def run(
    scenario: str, workdir: Path, proxies: bool, minimize: bool = False
) -> tuple[dict[str, Any], list[pb.RunEvent], list[pb.RunEvent]]:
    """The run's report and events, and the events of its minimize run (none without a trigger)."""
    path = scenario_path(scenario)
    settings = {"proxies": proxies}
    report = await demo(
        workdir, path, SPEED, logs=False, out=io.StringIO(), engine_settings=settings, minimize=minimize
    )
    store = Store(workdir / "k3repro.db")
    events = store.events(report["run_id"])
    minimized = store.events(report["minimize"]["run_id"]) if report.get("minimize") else []
    store.close()
    return report, events, minimized


async def measure(scenario: str, workdir: Path) -> dict[str, Any]:
    report, events, minimized = await run(scenario, workdir / "proxies", proxies=True, minimize=True)
    today, today_events, _ = await run(scenario, workdir / "today", proxies=False)
    tested = [step for step in today["ladder"] if step["outcome"] != "not_applicable"]
    repeats = today["launches"] - 1 - sum(step["relaunched"] for step in today["ladder"])
    naive = 1 + len(tested) + max(repeats, 0)  # without the baseline check, a naive plan launches at least once
    alive = _alive_by_launch(today_events)
    hangs = sum(1 for e in today_events if e.HasField("first_error") and e.first_error.line.startswith("hang:"))
    timings = load_scenario(str(scenario_path(scenario)), catalog().phases()).timings
    full_load = timings.gpu_detect + timings.weight_load + timings.engine_init + timings.api_listen
    if today["launches"]:
        naive_alive = (
            sum(alive.values()) + hangs * (VLLM_READY_TIMEOUT_S - STALL_S) + (naive - today["launches"]) * full_load
        )
    else:  # the baseline stopped the run: a naive launch would have failed initialising CUDA
        naive_alive = timings.gpu_detect
    proxy_alive = _alive_by_launch(events)
    proxy = [source for source in proxy_alive if source.endswith("/proxy")]
    proxy_launches = _weighted(proxy_alive)
    same = (report["decision"], report["trigger_step"], _first(report)) == (
        today["decision"],
        today["trigger_step"],
        _first(today),
    )
    return {
        "decision": report["decision"] or "-",
        "same": "yes" if same else "NO",
        "launches": report["launches"],
        "proxy_share": len(proxy),
        "weighted": proxy_launches,
        "today": today["launches"],
        "naive": naive,
        "minutes": sum(proxy_alive.values()) * GPUS / 60,
        "today_minutes": sum(alive.values()) * GPUS / 60,
        "naive_minutes": naive_alive * GPUS / 60,
        "ddmin": _weighted(_alive_by_launch(minimized)),
        "ddmin_minutes": sum(_alive_by_launch(minimized).values()) * GPUS / 60,
        "ddmin_result": _minimal(report),
    }


def _weighted(alive: dict[str, float]) -> float:
    """Launches in full loads: a proxy launch counts its measured start-up against the run's longest real one."""
    full = [t for source, t in alive.items() if not source.endswith("/proxy")]
    per_full = max(full, default=0.0)
    if not per_full:
        return float(len(alive))
    return len(full) + sum(t / per_full for source, t in alive.items() if source.endswith("/proxy"))


def _minimal(report: dict[str, Any]) -> str:
    result = (report.get("minimize") or {}).get("minimal_failing_command")
    if not result:
        return "-"
    return f"{len(result['flags'])} of {len(result['flags']) + len(result['irrelevant'])}: " + (
        " ".join(result["flags"]) or "none"
    )


def _first(report: dict[str, Any]) -> tuple[str, str] | None:
    error = report["first_error"]
    return (error["phase"], error["category"]) if error else None


def _alive_by_launch(events: list[pb.RunEvent]) -> dict[str, float]:
    """Per launch (one log source each), the simulated time from its first logged line to its last."""
    stamps: dict[str, list[datetime]] = defaultdict(list)
    for event in events:
        if event.HasField("log_chunk"):
            for line in event.log_chunk.lines:
                if found := STAMP.search(line):
                    stamps[event.log_chunk.source].append(
                        datetime.strptime(f"{found.group(1)} +0000", "%m-%d %H:%M:%S %z")
                    )
    return {source: (max(s) - min(s)).total_seconds() for source, s in stamps.items()}


def main() -> None:
    print(
        "| scenario | decision | same decision, trigger, first error | launches (proxies) | without proxies | naive "
        f"| GPU-minutes, {LOAD_MINUTES} min a full load | without proxies | naive | ratio to without "
        "| GPU-minutes measured | without proxies | naive | ratio to without "
        f"| minimize: 1-minimal flags | its launches (in full loads) | its GPU-minutes, {LOAD_MINUTES} min a full load "
        "| measured |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    totals: dict[str, float] = defaultdict(float)
    for scenario in builtin_scenarios():
        with tempfile.TemporaryDirectory() as tmp:
            row = asyncio.run(measure(scenario, Path(tmp)))
        for key in (
            "launches",
            "proxy_share",
            "weighted",
            "today",
            "naive",
            "minutes",
            "today_minutes",
            "naive_minutes",
            "ddmin",
            "ddmin_minutes",
        ):
            totals[key] += float(row[key])
        print(f"| {scenario} | {row['decision']} | {row['same']} | " + _figures(row) + _ddmin(row))
    print("| all | | | " + _figures(totals) + _ddmin({**totals, "ddmin_result": ""}))


def _figures(row: dict[str, Any]) -> str:
    per = row["weighted"] * LOAD_MINUTES * GPUS
    today, naive = int(row["today"]) * LOAD_MINUTES * GPUS, int(row["naive"]) * LOAD_MINUTES * GPUS
    measured, today_measured, naive_measured = row["minutes"], row["today_minutes"], row["naive_minutes"]
    return (
        f"{int(row['launches'])} ({int(row['proxy_share'])}) | {int(row['today'])} | {int(row['naive'])} | "
        f"{per:,.0f} | {today:,} | {naive:,} | {per / today if today else 0:.2f} | "
        f"{measured:,.0f} | {today_measured:,.0f} | {naive_measured:,.0f} | "
        f"{measured / today_measured if today_measured else 0:.2f} |"
    )


def _ddmin(row: dict[str, Any]) -> str:
    if row["ddmin_result"] == "-":
        return " - | - | - | - |"
    weighted = float(row["ddmin"])
    return (
        f" {row['ddmin_result']} | {weighted:.1f} | {weighted * LOAD_MINUTES * GPUS:,.0f} | "
        f"{float(row['ddmin_minutes']):,.0f} |"
    )


if __name__ == "__main__":
    main()
