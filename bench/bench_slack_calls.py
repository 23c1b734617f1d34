"""Slack Web API calls per run: the outbox (one thread, coalesced updates, files once) against one call per event.

Real runs (runner daemon with the sim backend, mTLS on loopback) through the Slack bot, at Slack's own
pacing (chat.postMessage 1/s per channel, chat.update 50/min), against the local Slack. The reference in
the same run is what a bot that wrote once per event would send: one call for each event the run stored.
Run: `.venv/bin/python -m bench.bench_slack_calls [SPEED]`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from bot.store import Store
from bot.web import serving
from kernel.tls import write_dev_certs
from tests.k3fixtures import bot_config, runner_data, running_runner
from tests.slack_api import SlackApi, command_body, parent_of, post, signed, slack_config

SCENARIOS = (("demo", False), ("healthy", False), ("demo", True))  # True: a 429 storm


async def one_run(scenario: str, storm: bool, speed: float, workdir: Path) -> tuple[Counter[str], int, float, str]:
    """`storm`: every second call of every Web API method is answered 429 (Retry-After 1 s)."""
    certs = write_dev_certs(workdir / "certs")
    api = await SlackApi().start()
    if storm:
        api.fail("*", 429, times=None, every=2, retry_after=1.0)
    async with running_runner(runner_data(certs, workdir / "runner", scenario=scenario, speed=speed)) as daemon:
        config = bot_config(certs, workdir / "k3.db", [f"127.0.0.1:{daemon.port}"])
        config = slack_config(config, api, post_interval_s=1.0, update_interval_s=1.2)
        async with serving(config, port=0) as served:
            started = time.monotonic()
            body = command_body("start cluster-a")
            await post(served, body, signed(body))
            await served.bot.idle()
            elapsed = time.monotonic() - started
    await api.stop()
    store = Store(workdir / "k3.db")
    run_id = store.runs()[0]["id"]
    events = len(store.events(run_id))
    decided = store.db.execute(
        "SELECT COUNT(*) FROM run_events WHERE run_id = ? AND kind = 'checklist_item'", [run_id]
    ).fetchone()[0]
    store.close()
    calls = Counter(c.method for c in api.calls if c.method not in ("auth.test", "chat.postEphemeral"))
    calls["429"] = len([c for c in api.calls if c.status == 429])
    return calls, events, elapsed, _thread_figures(api, decided)


def _thread_figures(api: SlackApi, decided: int) -> str:
    """Which message the updates went to, against the checklist items decided, and how long after the
    verdict reached Slack the card said so."""
    parent = parent_of(api)
    assert parent is not None
    checklist = api.thread(parent["ts"])[0]
    updates = Counter(c.body["ts"] for c in api.called("chat.update"))
    verdict = next(c.at for c in api.called("chat.postMessage") if c.body.get("reply_broadcast"))
    final = next(
        c.at for c in api.called("chat.update") if c.body["ts"] == parent["ts"] and "completed" in c.body["text"]
    )
    return (
        f"updates: card {updates[parent['ts']]}, checklist {updates[checklist['ts']]} for {decided} items decided;"
        f" card 'completed' {(final - verdict) * 1000:+.0f} ms after the verdict post's call"
    )


def main() -> None:
    speed = float(sys.argv[1]) if len(sys.argv) > 1 else 40
    print(f"one run per sim scenario at speed {speed}, Slack's pacing (1 post/s per channel, 50 updates/min)")
    for scenario, storm in SCENARIOS:
        with tempfile.TemporaryDirectory() as tmp:
            calls, events, elapsed, thread = asyncio.run(one_run(scenario, storm, speed, Path(tmp)))
        limited = calls.pop("429")
        total = sum(calls.values())
        if storm:
            print(
                f"{scenario:>8}  under a 429 storm (every second call of each method): {limited} of the calls were 429"
            )
        messages = calls["chat.postMessage"] + calls["chat.update"]
        files = calls["files.completeUploadExternal"]
        print(
            f"{scenario:>8}: {events} events -> outbox {total} calls: {calls['chat.postMessage']} posts, "
            f"{calls['chat.update']} updates, {files} files x 3 calls; thread complete {elapsed:.1f} s after the ack"
        )
        print(
            f"{'':>8}  one call per event (reference): {events} calls, >= {events} s at 1 post/s; "
            f"ratio all calls {total / events:.2f}, message writes {messages / events:.2f}"
        )
        print(f"{'':>8}  {thread}")
        print(f"{'':>8}  every method: {dict(sorted(calls.items()))}")


if __name__ == "__main__":
    main()
