"""Exactly once and never stuck: every message in its own slot, calls that land unanswered, writes that keep
failing, and the bot process SIGKILLed at chosen and at random points and started again."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from slack_sdk.web.async_client import AsyncWebClient

from bot.config import SlackConfig
from bot.slack.metrics import Metrics
from bot.slack.outbox import KEY_FIELD, MAX_ATTEMPTS, UPLOAD, Outbox, Write, _finish, _pending, _put
from bot.store import AsyncStore, Store
from kernel.tls import DevCerts
from tests.slack_api import (
    BOT_TOKEN,
    DIE,
    SIGNING_SECRET,
    SLOW,
    SlackApi,
    assert_thread_complete,
    command_body,
    parent_of,
    post,
    settle,
    signed,
    slack_bot,
)


@contextlib.asynccontextmanager
async def outbox_on(tmp_path: Path, api: SlackApi, **pacing: float) -> AsyncIterator[Outbox]:
    """An outbox alone (no runner), with run R1's thread in channel C1."""
    store = AsyncStore(tmp_path / "k3.db")
    client = AsyncWebClient(token=BOT_TOKEN, base_url=api.url, retry_handlers=[], timeout=5)
    settings = SlackConfig(BOT_TOKEN, SIGNING_SECRET, **pacing)
    outbox = Outbox(store, client, settings, Metrics())
    await store.call(Store.create_thread, "R1", "C1", "")
    try:
        yield outbox
    finally:
        await outbox.close()
        store.close()


def card(text: str = "card") -> Write:
    return Write("R1:card", "chat.postMessage", {"channel": "C1", "text": text}, "R1", creates="parent_ts")


def reply(key: str, text: str) -> Write:
    return Write(key, "chat.postMessage", {"channel": "C1", "text": text}, "R1", thread=True)


def test_each_message_has_its_own_slot_and_the_one_sent_longest_ago_goes_next(tmp_path: Path) -> None:
    store = Store(tmp_path / "k3.db")
    for name in ("card", "list"):
        _put(store, Write(f"R1:{name}:update", "chat.update", {"channel": "C1", "text": f"{name} 1"}, "R1"))

    def next_up() -> str:
        row = _pending(store, "update")[0]
        time.sleep(0.002)  # sent_at has milliseconds; the outbox's own pacing keeps sends further apart
        _finish(store, row, "sent", "")
        _put(store, Write(row.key, "chat.update", {"channel": "C1", "text": "newer"}, "R1"))  # a newer state
        return row.key

    order = [next_up() for _ in range(6)]
    store.close()
    assert order == ["R1:card:update", "R1:list:update"] * 3  # the card's newer states never starve the checklist


async def test_an_update_waits_for_the_message_it_comes_after(tmp_path: Path, api: SlackApi) -> None:
    async with outbox_on(tmp_path, api, post_interval_s=0, update_interval_s=0) as outbox:
        await outbox.put(card())
        await outbox.idle()
        api.fail("chat.postMessage", 503, times=2)
        await outbox.put(reply("R1:verdict", "verdict"))
        update = Write(
            "R1:card:update", "chat.update", {"channel": "C1", "text": "completed"}, "R1", target="parent_ts"
        )
        await outbox.put(Write(**{**update.__dict__, "after": "R1:verdict"}))
        await outbox.idle()
    verdict = next(c for c in api.called("chat.postMessage") if c.body["text"] == "verdict")
    (completed,) = api.called("chat.update")
    assert completed.at > verdict.at


async def test_a_post_that_landed_unanswered_is_found_not_posted_again(tmp_path: Path, api: SlackApi) -> None:
    async with outbox_on(tmp_path, api, post_interval_s=0) as outbox:
        api.fail("chat.postMessage", DIE, times=2)  # the card, then the first reply: in Slack, never answered
        api.fail("files.completeUploadExternal", DIE, times=1)
        await outbox.put(card())
        await outbox.put(reply("R1:a", "a"))
        await outbox.put(
            Write(
                "R1:f", UPLOAD, {"channel": "C1", "filename": "f.txt", "title": "f"}, "R1", True, extra={"content": "x"}
            )
        )
        await outbox.put(reply("R1:b", "b"))
        await outbox.idle()
        thread = await outbox.store.call(Store.thread, "R1")
    assert [m["text"] for m in api.posted()] == ["card", "a", "b"]
    assert [m["metadata"]["event_payload"][KEY_FIELD] for m in api.posted()] == ["R1:card", "R1:a", "R1:b"]
    assert thread is not None and thread.parent_ts == api.posted()[0]["ts"]
    assert [f["title"] for f in api.files] == ["f"] and api.called("files.info")
    assert len(api.called("conversations.history")) == 1 and len(api.called("conversations.replies")) == 1


async def test_a_landed_post_beyond_slacks_first_page_is_found_not_posted_again(tmp_path: Path, api: SlackApi) -> None:
    """Slack answers a look-up a page at a time: people talking in the thread, or in a busy channel, push what
    an unanswered attempt posted past the first page."""
    async with outbox_on(tmp_path, api, post_interval_s=0) as outbox:
        await outbox.put(card())
        await outbox.idle()
        parent = api.posted()[0]["ts"]
        for n in range(250):
            api.say("C1", f"in the thread {n}", thread_ts=parent)
        api.fail("chat.postMessage", DIE, times=2)  # a reply, then a second card: in Slack, never answered
        await outbox.put(reply("R1:a", "a"))
        await outbox.idle()
        await outbox.store.call(Store.create_thread, "R2", "C1", "")
        await outbox.put(
            Write("R2:card", "chat.postMessage", {"channel": "C1", "text": "second"}, "R2", creates="parent_ts")
        )
        await api.wait_for(lambda: len(api.called("chat.postMessage", DIE)) == 2)
        for n in range(250):  # before the retry (its back-off is half a second) looks for it
            api.say("C1", f"in the channel {n}")
        await outbox.idle()
    ours = [m["text"] for m in api.posted() if m.get("metadata")]
    assert ours == ["card", "a", "second"]  # each once
    assert len(api.called("conversations.replies")) == 2 and len(api.called("conversations.history")) == 2


async def test_a_write_that_keeps_failing_becomes_a_short_text_and_later_ones_go_on(
    tmp_path: Path, api: SlackApi
) -> None:
    async with outbox_on(tmp_path, api, post_interval_s=0) as outbox:
        await outbox.put(card())
        await outbox.idle()
        api.fail("files.completeUploadExternal", 429, times=None, retry_after=0.01)
        api.fail("chat.postMessage", 429, times=MAX_ATTEMPTS, retry_after=0.01)  # the long message, all its attempts
        await outbox.put(reply("R1:long", "a long message"))
        await outbox.put(
            Write(
                "R1:f",
                UPLOAD,
                {"channel": "C1", "filename": "f.log", "title": "stage log"},
                "R1",
                True,
                extra={"content": "x"},
            )
        )
        await outbox.put(reply("R1:after", "after"))
        await outbox.idle()
        rows = await outbox.store.call(lambda s: [dict(r) for r in s.db.table("slack_outbox").rows])
    texts = [m["text"] for m in api.posted()]
    assert texts[0] == "card" and texts[-1] == "after" and len(texts) == 4
    assert texts[1].startswith("a long message\n_(shortened") and "ratelimited after 8 attempts" in texts[1]
    assert texts[2].startswith("📎 stage log (`f.log`) could not be uploaded (ratelimited after 8 attempts)")
    assert len(api.called("files.completeUploadExternal", 429)) == MAX_ATTEMPTS
    assert len(api.called("files.getUploadURLExternal")) == 1  # only the failing step was repeated
    assert {r["state"] for r in rows} == {"sent"}


async def test_every_method_limited_slow_and_dying_the_thread_is_complete_once(
    certs: DevCerts, tmp_path: Path, api: SlackApi
) -> None:
    async with slack_bot(certs, tmp_path, api, speed=60, timeout_s=2) as served:
        api.fail("*", 429, times=None, every=2, retry_after=0.02)  # every second call of each method
        api.fail("chat.postMessage", DIE, times=3, every=1)
        api.fail("files.completeUploadExternal", DIE, times=1)
        api.fail("chat.update", SLOW, times=4, retry_after=0.3)
        body = command_body("start cluster-a")
        await post(served, body, signed(body))
        await settle(served)
        run = Store(tmp_path / "k3.db").runs()[0]
    assert_thread_complete(api)
    parent = parent_of(api)
    assert parent is not None and (run.channel, run.thread_ts) == ("C-OPS", parent["ts"])
    assert api.called("chat.update", 429) and api.called("conversations.replies", 429) is not None


async def test_a_look_up_slack_refuses_for_good_means_posting_again_not_losing(tmp_path: Path, api: SlackApi) -> None:
    async with outbox_on(tmp_path, api, post_interval_s=0) as outbox:
        await outbox.put(card())
        await outbox.idle()
        api.fail("chat.postMessage", DIE, times=1)
        api.fail("conversations.replies", 400, times=None)  # e.g. an app without the channels:history scope
        await outbox.put(reply("R1:a", "a"))
        await outbox.idle()
    assert [m["text"] for m in api.posted()] == ["card", "a", "a"]  # at least once, when once cannot be known
