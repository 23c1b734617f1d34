"""Launches and simulated GPU-minutes to a verdict, for every shipped scenario, against a naive plan.

Each scenario runs the way `k3repro demo --scenario NAME --json` runs it (its [deployment] on the sim
backend). The naive plan is the same method without reuse: every ladder step that was tested relaunches
the engine, and each step is launched on its own. Both come from the same run (the naive figures are derived
from what the run tested). Two cost models:
- per launch: one full load of a 1T-parameter model takes LOAD_MINUTES on the node's GPUS GPUs, whatever
  happens to the launch;
- measured: the simulated seconds each engine of the run was alive (first to last line of its log, the stop
  included), times GPUS. The naive plan's extra launches each cost a full start-up of the scenario's model
  (a launch the baseline prevented: its gpu_detect phase), and its hangs last until vLLM's own start-up
  timeout (VLLM_ENGINE_READY_TIMEOUT_S) instead of the runner's stall limit. The measured figure includes
  the runner's own overhead, scaled by the sim speed.
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

from bot.commands.demo import demo
from bot.store import Store
from protos import runner_pb2 as pb
from runner.sim.catalog import catalog
from runner.sim.scenario import builtin_scenarios, load_scenario, scenario_path

LOAD_MINUTES = 15
GPUS = 8
SPEED = 100  # where the demo's stall limit is still 300 simulated seconds
STALL_S = 300.0  # bot/data/demo.toml's stall_timeout_s (simulated)
VLLM_READY_TIMEOUT_S = 600.0  # what vLLM itself waits for its engine to come up
STAMP = re.compile(r" (\d\d-\d\d \d\d:\d\d:\d\d) \[")


async def measure(scenario: str, workdir: Path) -> dict[str, float]:
    path = scenario_path(scenario)
    report = await demo(workdir, path, SPEED, logs=False, out=io.StringIO())
    store = Store(workdir / "k3repro.db")
    events = store.events(report["run_id"])
    store.close()
    tested = [step for step in report["ladder"] if step["outcome"] != "not_applicable"]
    repeats = report["launches"] - 1 - sum(step["relaunched"] for step in report["ladder"])
    naive = 1 + len(tested) + max(repeats, 0)  # without the baseline check, a naive plan launches at least once
    alive = _alive_seconds(events)
    hangs = sum(1 for e in events if e.HasField("first_error") and e.first_error.line.startswith("hang:"))
    timings = load_scenario(str(path), catalog().phases()).timings
    full_load = timings.gpu_detect + timings.weight_load + timings.engine_init + timings.api_listen
    if report["launches"]:
        naive_alive = alive + hangs * (VLLM_READY_TIMEOUT_S - STALL_S) + (naive - report["launches"]) * full_load
    else:  # the baseline stopped the run: a naive launch would have failed initialising CUDA
        naive_alive = timings.gpu_detect
    return {
        "decision": report["decision"] or "-",
        "launches": report["launches"],
        "naive": naive,
        "minutes": alive * GPUS / 60,
        "naive_minutes": naive_alive * GPUS / 60,
    }


def _alive_seconds(events: list[pb.RunEvent]) -> float:
    """Per launch (one log source each), the simulated time from its first logged line to its last."""
    stamps: dict[str, list[datetime]] = defaultdict(list)
    for event in events:
        if event.HasField("log_chunk"):
            for line in event.log_chunk.lines:
                if found := STAMP.search(line):
                    stamps[event.log_chunk.source].append(
                        datetime.strptime(f"{found.group(1)} +0000", "%m-%d %H:%M:%S %z")
                    )
    return sum((max(s) - min(s)).total_seconds() for s in stamps.values())


def main() -> None:
    print(
        f"| scenario | decision | launches | naive plan | GPU-minutes, {LOAD_MINUTES} min a launch | naive "
        f"| ratio | GPU-minutes measured | naive | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    totals = defaultdict(float)
    for scenario in builtin_scenarios():
        with tempfile.TemporaryDirectory() as tmp:
            row = asyncio.run(measure(scenario, Path(tmp)))
        for key in ("launches", "naive", "minutes", "naive_minutes"):
            totals[key] += float(row[key])
        print(f"| {scenario} | {row['decision']} | " + _figures(row))
    print("| all | | " + _figures(totals))


def _figures(row: dict[str, float]) -> str:
    launches, naive = int(row["launches"]), int(row["naive"])
    per, naive_per = launches * LOAD_MINUTES * GPUS, naive * LOAD_MINUTES * GPUS
    measured, naive_measured = row["minutes"], row["naive_minutes"]
    return (
        f"{launches} | {naive} | {per:,} | {naive_per:,} | {per / naive_per:.2f} | "
        f"{measured:,.0f} | {naive_measured:,.0f} | {measured / naive_measured if naive_measured else 0:.2f} |"
    )


if __name__ == "__main__":
    main()
