"""The outbox against a misbehaving Slack: 429s, 5xx, time-outs, pacing, coalescing, and a bot restart mid-run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from slack_sdk.web.async_client import AsyncWebClient

from bot.config import SlackConfig
from bot.slack.metrics import Metrics
from bot.slack.outbox import Outbox, Write, _pending, _put, _write
from bot.store import AsyncStore, Store
from bot.web import serving
from kernel.tls import DevCerts
from tests.k3fixtures import bot_config, runner_data, running_runner
from tests.slack_api import (
    BOT_TOKEN,
    SIGNING_SECRET,
    SlackApi,
    assert_thread_complete,
    command_body,
    parent_of,
    post,
    settle,
    signed,
    slack_bot,
    slack_config,
)


async def test_slack_rate_limiting_for_a_while_during_a_run_loses_nothing(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with slack_bot(certs, tmp_path, api, speed=60) as served:
        body = command_body("start cluster-a")
        status, _ = await post(served, body, signed(body))
        await api.wait_for(lambda: parent_of(api), what="the run card")
        api.fail("*", 429, for_s=1.2, retry_after=0.4)  # every method, while the run goes on
        await settle(served)
        limited = served.bot.metrics.value(
            "k3repro_slack_writes_total", method="chat.postMessage", outcome="ratelimited"
        )
    assert status == 200
    assert_thread_complete(api)
    assert limited >= 1 and api.called("chat.update", 429)
    # Retry-After is honoured: after a 429, that method is not called again before it has passed
    for method in ("chat.postMessage", "chat.update"):
        calls = [c for c in api.calls if c.method == method]
        for before, after in itertools.pairwise(calls):
            if before.status == 429:
                assert after.at - before.at >= 0.38, method


async def test_server_errors_and_time_outs_are_retried_until_the_thread_is_complete(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with slack_bot(certs, tmp_path, api) as served:
        api.fail("chat.postMessage", 500, times=2)
        api.fail("chat.update", 0, times=1, retry_after=1.5)  # hangs past the 1 s client time-out
        api.fail("files.completeUploadExternal", 503, times=1)
        body = command_body("start cluster-a")
        await post(served, body, signed(body))
        await settle(served)
        retried = {
            method: served.bot.metrics.value("k3repro_slack_writes_total", method=method, outcome="retried")
            for method in ("chat.postMessage", "chat.update", "files.upload")
        }
    assert_thread_complete(api)
    assert retried == {"chat.postMessage": 2, "chat.update": 1, "files.upload": 1}


async def test_a_bot_restarted_mid_run_continues_the_same_thread(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="demo", speed=12)) as daemon:
        config = slack_config(bot_config(certs, tmp_path / "k3.db", [f"127.0.0.1:{daemon.port}"]), api)
        async with serving(config, port=0) as served:
            body = command_body("start cluster-a")
            await post(served, body, signed(body))
            parent = await api.wait_for(lambda: parent_of(api), what="the run card")
            await api.wait_for(lambda: len(api.thread(parent["ts"])) >= 2, what="a stage result")
            api.fail("chat.postMessage", 429, for_s=0.5, retry_after=0.5)  # leave writes pending in the outbox
            await api.wait_for(lambda: api.called("chat.postMessage", 429), what="a 429")
        stopped = Store(tmp_path / "k3.db")
        run = stopped.runs()[0]
        pending = stopped.db.execute("SELECT COUNT(*) FROM slack_outbox WHERE state = 'pending'").fetchone()[0]
        stopped.close()
        assert run.status == "running" and pending > 0, "the test must stop the bot mid-run with writes pending"
        async with serving(config, port=0) as served:
            await settle(served)
    assert_thread_complete(api)
    assert parent_of(api) is parent and Store(tmp_path / "k3.db").get_run(run.id).status == "completed"


async def test_posts_are_paced_per_channel_and_updates_coalesce_to_the_latest_state(
    tmp_path: Path, api: SlackApi
) -> None:
    store = AsyncStore(tmp_path / "k3.db")
    client = AsyncWebClient(token=BOT_TOKEN, base_url=api.url, retry_handlers=[])
    settings = SlackConfig(BOT_TOKEN, SIGNING_SECRET, post_interval_s=0.1, update_interval_s=0.3)
    outbox = Outbox(store, client, settings, Metrics())
    await store.call(Store.create_thread, "R1", "C1", "")
    await outbox.put(Write("R1:card", "chat.postMessage", {"channel": "C1", "text": "card"}, "R1", creates="parent_ts"))
    for n in range(30):
        args: dict[str, Any] = {"channel": "C1", "text": f"state {n}"}
        await outbox.put(Write("R1:card:update", "chat.update", args, "R1", target="parent_ts"))
    for channel in ("C1", "C2"):
        for n in range(4):
            await outbox.put(
                Write(f"{channel}:{n}", "chat.postMessage", {"channel": channel, "text": f"{channel} {n}"})
            )
    await outbox.idle()
    await outbox.close()
    store.close()
    updates = api.called("chat.update")
    assert 1 <= len(updates) <= 3 and updates[-1].body["text"] == "state 29"
    assert api.messages[updates[-1].body["ts"]]["text"] == "state 29"
    for channel, count in (("C1", 5), ("C2", 4)):
        times = [c.at for c in api.called("chat.postMessage") if c.body["channel"] == channel]
        assert len(times) == count
        assert all(b - a >= 0.09 for a, b in itertools.pairwise(times)), channel
    assert [c.body["text"] for c in api.called("chat.postMessage") if c.body["channel"] == "C2"] == [
        f"C2 {n}" for n in range(4)
    ]
    c1, c2 = ([c.at for c in api.called("chat.postMessage") if c.body["channel"] == ch] for ch in ("C1", "C2"))
    assert c2[0] < c1[-1] and c1[0] < c2[-1]  # the two channels were paced side by side, not one after the other


async def test_a_write_slack_refuses_for_good_is_dropped_and_the_rest_goes_on(tmp_path: Path, api: SlackApi) -> None:
    store = AsyncStore(tmp_path / "k3.db")
    client = AsyncWebClient(token="xoxp-not-a-bot-token", base_url=api.url, retry_handlers=[])
    outbox = Outbox(store, client, SlackConfig(BOT_TOKEN, SIGNING_SECRET, post_interval_s=0), Metrics())
    await store.call(Store.create_thread, "R1", "C1", "")
    await outbox.put(Write("R1:card", "chat.postMessage", {"channel": "C1", "text": "x"}, "R1", creates="parent_ts"))
    await outbox.put(Write("R1:reply", "chat.postMessage", {"channel": "C1", "text": "y"}, "R1", thread=True))
    await outbox.idle()
    rows = await store.call(lambda s: [dict(r) for r in s.db.table("slack_outbox").rows])
    await outbox.close()
    store.close()
    assert [(r["key"], r["state"], r["error"]) for r in rows] == [
        ("R1:card", "failed", "invalid_auth"),
        ("R1:reply", "failed", "the message of run R1 this write needs (parent_ts) could not be posted"),
    ]
    assert len(api.called("chat.postMessage")) == 1


def test_the_outbox_row_keeps_what_it_needs_to_resend_after_a_restart(tmp_path: Path) -> None:
    write = Write(
        "k", "files.upload", {"channel": "C1", "filename": "f.log"}, "R1", thread=True, extra={"content": "x"}
    )
    store = Store(tmp_path / "k3.db")
    _put(store, write)
    (row,) = _pending(store, "post:C1")
    assert _write(row) == write and row.lane == "post:C1" and json.loads(row.payload_json)["extra"] == {"content": "x"}
