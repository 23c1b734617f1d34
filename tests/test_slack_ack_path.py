"""Acks on their own path: a slash command is acked while the bot's home loop (where followed runs' events are
folded, rendered and stored) is busy, and the work after the ack still runs there."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest

from bot.web import SLACK_PATH, serving
from tests.k3fixtures import bot_config
from tests.slack_api import SlackApi, command_body, signed, slack_config

pytestmark = pytest.mark.sim

BUSY_S = 1.5


def _post(url: str, text: str) -> tuple[float, bytes]:
    body = command_body(text)
    headers = {"Content-Type": "application/x-www-form-urlencoded", **signed(body)}
    started = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, body.encode(), headers), timeout=10) as response:
        answer = response.read()
    return time.perf_counter() - started, answer


@pytest.mark.parametrize("shared", [False, True])
async def test_an_ack_never_waits_behind_the_home_loop(api: SlackApi, tmp_path: Path, shared: bool) -> None:
    config = slack_config(bot_config(None, tmp_path / "k3.db", ["127.0.0.1:9"]), api)
    async with serving(config, port=0, shared_loop=shared) as served:
        url = f"http://127.0.0.1:{served.port}{SLACK_PATH}"
        sent = asyncio.get_running_loop().run_in_executor(None, _post, url, "help")
        time.sleep(BUSY_S)  # the home loop held: a burst of events being digested
        elapsed, answer = await sent
        await asyncio.get_running_loop().run_in_executor(None, _post, url, "status")
        await served.bot.idle()  # the status answer, after its ack, went out from the home loop
    assert b"/k3repro" in answer
    if shared:  # the reference: one loop for both, the ack waited for the burst
        assert elapsed >= BUSY_S - 0.2
    else:
        assert elapsed < BUSY_S / 2
    assert any(call.method == "chat.postEphemeral" for call in api.calls)
