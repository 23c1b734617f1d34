"""Start-up against a Slack that is not there or says no: one line per problem, retried with backoff while
Slack cannot be reached, and /healthz says why the bot is not ready."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp

from bot.web import Served, serving
from tests.k3fixtures import bot_config
from tests.slack_api import SIGNING_SECRET, SlackApi, slack_config


async def health(served: Served) -> tuple[int, dict[str, Any]]:
    url = f"http://127.0.0.1:{served.port}/healthz"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json()


async def until_health(served: Served, status: int, why: str = "") -> dict[str, Any]:
    """Until /healthz answers `status` (and, when not ready, a reason that starts with `why`)."""
    for _ in range(600):
        got, body = await health(served)
        if got == status and str(body.get("why", "")).startswith(why):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"/healthz never answered {status} {why}")


async def test_slack_failing_at_start_is_retried_and_healthz_says_why(tmp_path: Path, api: SlackApi) -> None:
    api.fail("auth.test", 503, times=2)
    config = slack_config(bot_config(None, tmp_path / "k3.db", ["127.0.0.1:9"]), api)
    async with serving(config, port=0, ready=False) as served:
        why = (await until_health(served, 503, "Slack answered"))["why"]
        assert why == "Slack answered auth.test with fatal_error; retrying in 1 s"
        assert await until_health(served, 200) == {"ok": True}
    assert [c.status for c in api.calls] == [503, 503, 200]


async def test_an_unreachable_slack_is_named_on_healthz_and_the_bot_stops_cleanly(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    config = bot_config(None, tmp_path / "k3.db", ["127.0.0.1:9"])
    api = SlackApi()  # never started: only its URL, on a port nothing listens on
    api.port = port
    async with serving(slack_config(config, api), port=0, ready=False) as served:
        why = (await until_health(served, 503, "Slack unreachable"))["why"]
        assert why.startswith(f"Slack unreachable at http://127.0.0.1:{port}/api/ (ClientConnectorError")
        assert "\n" not in why
        assert not served.started.done()


async def test_a_refused_token_is_one_line_and_exit_2(tmp_path: Path, api: SlackApi) -> None:
    config = tmp_path / "k3repro.toml"
    config.write_text(
        f"""store = "k3.db"
[slack]
api_url = "{api.url}"
listen = "127.0.0.1:0"
[clusters.cluster-a]
runners = ["127.0.0.1:9"]
image = "vllm/vllm-openai:kimi-k3"
launch = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8"
"""
    )
    env = {**os.environ, "SLACK_BOT_TOKEN": "xoxp-not-a-bot-token", "SLACK_SIGNING_SECRET": SIGNING_SECRET}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.main", "--config", str(config), "serve", env=env, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(process.communicate(), 60)
    lines = stderr.decode().splitlines()
    assert process.returncode == 2 and not any("Traceback" in line for line in lines)
    assert lines[-1] == (
        "k3repro-bot: Slack refused the bot token (invalid_auth): set [slack] bot_token or $SLACK_BOT_TOKEN"
        " to the app's Bot User OAuth Token (xoxb-…)"
    )
    assert [c.method for c in api.calls] == ["auth.test"]
