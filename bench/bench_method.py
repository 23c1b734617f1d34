"""Launches and simulated GPU-minutes to a verdict, for every shipped scenario, against a naive plan.

Each scenario runs the way `k3repro demo --scenario NAME --json` runs it (its [deployment] on the sim
backend). The naive plan is the same method without reuse: every ladder step that was tested relaunches
the engine, and each step is launched on its own. Both counts come from the same run (the naive figure is
derived from what the run tested). Cost model: one full load of a 1T-parameter model takes LOAD_MINUTES
on the node's GPUS GPUs.
Run: `.venv/bin/python bench/bench_method.py`.
"""

from __future__ import annotations

import asyncio
import io
import tempfile
from pathlib import Path

from bot.commands.demo import demo
from runner.sim.scenario import builtin_scenarios, scenario_path

LOAD_MINUTES = 15
GPUS = 8
SPEED = 800


async def measure(scenario: str, workdir: Path) -> tuple[int, int, str]:
    report = await demo(workdir, scenario_path(scenario), SPEED, logs=False, out=io.StringIO())
    tested = [step for step in report["ladder"] if step["outcome"] != "not_applicable"]
    repeats = report["launches"] - 1 - sum(step["relaunched"] for step in report["ladder"])
    naive = 1 + len(tested) + max(repeats, 0)  # without the baseline check, a naive plan launches at least once
    return report["launches"], naive, report["decision"] or "-"


def main() -> None:
    scenarios = builtin_scenarios()
    print(
        f"| scenario | decision | launches | naive plan | GPU-minutes ({GPUS} GPUs × {LOAD_MINUTES} min a load) | naive | ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    total, total_naive = 0, 0
    for scenario in scenarios:
        with tempfile.TemporaryDirectory() as tmp:
            launches, naive, decision = asyncio.run(measure(scenario, Path(tmp)))
        total, total_naive = total + launches, total_naive + naive
        minutes, naive_minutes = launches * LOAD_MINUTES * GPUS, naive * LOAD_MINUTES * GPUS
        print(
            f"| {scenario} | {decision} | {launches} | {naive} | {minutes:,} | {naive_minutes:,} | {launches / naive:.2f} |"
        )
    print(
        f"| all | | {total} | {total_naive} | {total * LOAD_MINUTES * GPUS:,} | {total_naive * LOAD_MINUTES * GPUS:,} | {total / total_naive:.2f} |"
    )


if __name__ == "__main__":
    main()
