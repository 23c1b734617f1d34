"""Slack ack latency under load: K runs stream into the bot while `/k3repro status` commands are acked.

For each K: a helper process hosts K sim runners (one per cluster, as K GPU hosts) and the local Slack Web API
(tests/slack_api.py), so neither shares the bot's process; the bot (bot/web.py's `serving`, the real front-end)
gets K signed `/k3repro start cluster-i` commands, then, while the runs stream their events into its store and
threads, one signed `/k3repro status` at a time, each one's ack timed, until every run has finished. Then the
bot is let go idle and the store is checked: every start either refused in one line or a run that finished, its
events stored without a gap, no Slack write left pending, and one verdict post (the broadcast reply) per run.
`--loop both` also times the old arrangement (acks on the loop that follows the runs) in the same run. Slack counts an ack after 3 s as failed.
Run: `.venv/bin/python -m bench.bench_load [K ...] [--scenario demo|healthy] [--speed S]`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp

from bot.web import SLACK_PATH, serving
from tests.k3fixtures import bot_config, runner_data
from tests.slack_api import command_body, signed, slack_config

ACK_LIMIT_S = 3.0  # what Slack allows
STATUS_GAP_S = 0.05  # between one status ack and the next command


async def _host(k: int, scenario: str, speed: float, state: Path) -> None:
    """The helper process: K runners and the local Slack API; prints their addresses, lives until stdin closes."""
    from runner.config import parse_runner_config
    from runner.daemon import RunnerDaemon
    from tests.slack_api import SlackApi

    api = await SlackApi().start()
    daemons = []
    for i in range(k):
        data = runner_data(None, state / f"r{i}", scenario=scenario, speed=speed, cluster=f"cluster-{i}")
        daemon = RunnerDaemon(parse_runner_config(data, base=state / f"r{i}", origin="bench runner"))
        await daemon.start()
        daemons.append(daemon)
    print(json.dumps({"slack": api.url, "runners": [d.port for d in daemons]}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for daemon in daemons:
        await daemon.stop("bench over", grace_s=1)
    await api.stop()


async def _post(session: aiohttp.ClientSession, url: str, text: str) -> float:
    body = command_body(text, trigger=f"bench-{time.monotonic_ns()}")
    headers = {"Content-Type": "application/x-www-form-urlencoded", **signed(body)}
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as response:
        await response.read()
        assert response.status == 200, response.status
    return time.perf_counter() - started


def _active(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return int(con.execute("SELECT count(*) FROM runs WHERE status IN ('queued', 'running')").fetchone()[0])


def _check(db: Path, k: int) -> dict[str, Any]:
    """Nothing lost: every run finished, its events 1..N without a gap, no write pending, one verdict post each."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        runs = con.execute("SELECT id, status FROM runs").fetchall()
        gaps = [
            run_id
            for run_id, count, top in con.execute("SELECT run_id, count(*), max(seq) FROM run_events GROUP BY run_id")
            if count != top
        ]
        pending = con.execute("SELECT count(*) FROM slack_outbox WHERE state != 'sent'").fetchone()[0]
        refused = sum(
            json.loads(payload)["args"].get("text", "").startswith("⛔")
            for (payload,) in con.execute("SELECT payload_json FROM slack_outbox WHERE method = 'chat.postEphemeral'")
        )
        verdicts: dict[str, int] = {}
        for run_id, payload in con.execute(
            "SELECT run_id, payload_json FROM slack_outbox WHERE method = 'chat.postMessage'"
        ):
            if json.loads(payload)["args"].get("reply_broadcast"):
                verdicts[run_id] = verdicts.get(run_id, 0) + 1
    finished = [r for r, status in runs if status not in ("queued", "running")]
    return {
        "runs": len(runs),
        "finished": len(finished),
        "statuses": sorted({status for _, status in runs}),
        "event_gaps": len(gaps),
        "pending_writes": pending,
        "refused": refused,  # a start answered with a refusal (e.g. its runner did not answer Describe in time)
        "one_verdict_each": len(runs) + refused == k and all(verdicts.get(r) == 1 for r, _ in runs),
    }


async def one_k(k: int, scenario: str, speed: float, workdir: Path, shared: bool = False) -> dict[str, Any]:
    state = workdir / f"k{k}{'-shared' if shared else ''}"
    state.mkdir()
    host = subprocess.Popen(  # noqa: ASYNC220 (started once per K, before anything is timed)
        [
            sys.executable,
            "-m",
            "bench.bench_load",
            "--host",
            str(k),
            "--scenario",
            scenario,
            "--speed",
            str(speed),
            "--state",
            str(state),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert host.stdout is not None
        where = json.loads(await asyncio.to_thread(host.stdout.readline))
        base = bot_config(None, state / "k3.db", [f"127.0.0.1:{where['runners'][0]}"])
        config = slack_config(base, SimpleNamespace(url=where["slack"]))  # type: ignore[arg-type]
        template = config.clusters["cluster-a"]
        clusters = {
            f"cluster-{i}": replace(template, name=f"cluster-{i}", runners=(f"127.0.0.1:{port}",))
            for i, port in enumerate(where["runners"])
        }
        config = replace(config, clusters=clusters)
        async with serving(config, port=0, shared_loop=shared) as served, aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{served.port}{SLACK_PATH}"
            began = time.perf_counter()
            starts = await asyncio.gather(*(_post(session, url, f"start cluster-{i}") for i in range(k)))
            acks: list[float] = []
            await asyncio.sleep(0.2)
            while True:
                acks.append(await _post(session, url, "status"))
                await asyncio.sleep(STATUS_GAP_S)
                if len(acks) >= 5 and not _active(state / "k3.db") and not served.bot.threads._tasks:
                    break
            await served.bot.idle()
            wall = time.perf_counter() - began
        report = _check(state / "k3.db", k)
    finally:
        if host.stdin is not None:
            host.stdin.close()
        host.wait(timeout=60)
    quantiles = statistics.quantiles(acks, n=100) if len(acks) > 1 else [acks[0]] * 99
    return {
        "k": k,
        "loop": "shared" if shared else "front",
        "status_acks": len(acks),
        "p50_ms": quantiles[49] * 1000,
        "p99_ms": quantiles[98] * 1000,
        "max_ms": max(acks) * 1000,
        "over_3s": sum(1 for a in acks if a > ACK_LIMIT_S),
        "start_ack_max_ms": max(starts) * 1000,
        "wall_s": wall,
        **report,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ks", nargs="*", type=int, default=[1, 16, 64, 100])
    parser.add_argument("--scenario", default="demo")
    parser.add_argument("--speed", type=float, default=2000)
    parser.add_argument(
        "--loop", choices=("front", "shared", "both"), default="front", help="shared: acks on the runs' loop, as before"
    )
    parser.add_argument("--keep", default="", help="a folder to keep the stores in")
    parser.add_argument("--host", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--state", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.host:
        asyncio.run(_host(args.host, args.scenario, args.speed, Path(args.state)))
        return
    print(f"scenario {args.scenario}, sim speed {args.speed:g}; status acked while K runs stream (Slack: < 3 s)")
    print(
        "   K loop    acks   p50 ms   p99 ms   max ms  >3s  start max ms  wall s  runs done  gaps  pending  refused  1 verdict each"
    )
    with tempfile.TemporaryDirectory() as tmp:
        if args.keep:
            tmp = args.keep
        for k in args.ks:
            for shared in {"front": [False], "shared": [True], "both": [True, False]}[args.loop]:
                r = asyncio.run(one_k(k, args.scenario, args.speed, Path(tmp), shared))
                print(
                    f"{r['k']:4d} {r['loop']:6s} {r['status_acks']:5d} {r['p50_ms']:8.1f} {r['p99_ms']:8.1f} {r['max_ms']:8.1f}"
                    f" {r['over_3s']:4d} {r['start_ack_max_ms']:13.1f} {r['wall_s']:7.1f} {r['finished']:5d}/{r['runs']:<4d}"
                    f" {r['event_gaps']:5d} {r['pending_writes']:8d} {r['refused']:8d}  {r['one_verdict_each']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
