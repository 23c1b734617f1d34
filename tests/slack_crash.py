"""The bot process (`k3repro-bot serve`) SIGKILLed at chosen and random points of a run and started again,
until the run's thread is complete (tests/test_slack_crash.py, bench/bench_slack_crash.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from bot.store import ACTIVE, Store
from kernel.tls import DevCerts
from tests.k3fixtures import runner_data, running_runner
from tests.slack_api import (
    BOT_TOKEN,
    SIGNING_SECRET,
    SLOW,
    SlackApi,
    command_body,
    signed,
)


def write_config(path: Path, certs: DevCerts, runner_port: int, api: SlackApi) -> None:
    path.write_text(
        f"""store = "k3.db"
connect_timeout_s = 3
reconnect_for_s = 30
[tls]
ca = "{certs.ca}"
cert = "{certs.bot_cert}"
key = "{certs.bot_key}"
[slack]
api_url = "{api.url}"
listen = "127.0.0.1:0"
post_interval_s = 0.05
update_interval_s = 0.05
timeout_s = 5
[clusters.cluster-a]
runners = ["127.0.0.1:{runner_port}"]
image = "vllm/vllm-openai:kimi-k3"
launch = "vllm serve moonshotai/Kimi-K3 --tensor-parallel-size 8"
profile = "kimi-k3"
channels = ["C-OPS"]
operators = ["U-OPS"]
[clusters.cluster-a.request]
api = "chat"
repeats = 3
body = {{ messages = [{{ role = "user", content = "hi" }}], max_tokens = 16 }}
"""
    )


@contextlib.asynccontextmanager
async def bot_process(config: Path) -> AsyncIterator[tuple[asyncio.subprocess.Process, int]]:
    """`k3repro-bot serve` until it is ready (/healthz 200); killed on the way out if still running."""
    env = {**os.environ, "SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_SIGNING_SECRET": SIGNING_SECRET}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot.main", "--config", str(config), "serve", env=env, stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    try:
        port = 0
        while not port:
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "k3repro-bot exited before serving"
            if match := re.search(r"serving \(HTTP\) on port (\d+)", line):
                port = int(match.group(1))
        drain = asyncio.ensure_future(process.stderr.read())  # keep the pipe from filling
        async with aiohttp.ClientSession() as session:
            for _ in range(1200):
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    if response.status == 200:
                        break
                await asyncio.sleep(0.05)
        yield process, port
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        drain.cancel()


def finished(store_path: Path) -> bool:
    """The run ended and every Slack write it caused is in Slack."""
    store = Store(store_path)
    try:
        runs = store.runs()
        return bool(runs) and runs[0].status not in ACTIVE and store.pending_count() == 0
    finally:
        store.close()


async def killed_run(certs: DevCerts, tmp_path: Path, api: SlackApi, kills: int, rng: random.Random) -> int:
    """One demo run whose bot is SIGKILLed `kills` times: every other kill while a post has landed in Slack and
    its answer has not reached the bot (Slack answers every third post and two file completions 2 s late),
    the others at random moments; then the last bot finishes the run. Returns the kills made in flight."""
    api.fail("chat.postMessage", SLOW, times=None, every=3, retry_after=2.0)
    api.fail("files.completeUploadExternal", SLOW, times=2, retry_after=2.0)
    config = tmp_path / "k3repro.toml"
    in_flight = 0
    async with running_runner(runner_data(certs, tmp_path / "runner", scenario="demo", speed=8)) as daemon:
        write_config(config, certs, daemon.port, api)
        for kill in range(kills + 1):
            async with bot_process(config) as (process, port):
                if kill == 0:
                    body = command_body("start cluster-a")
                    url = f"http://127.0.0.1:{port}/slack/events"
                    headers = {"Content-Type": "application/x-www-form-urlencoded", **signed(body)}
                    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as r:
                        assert r.status == 200
                if kill == kills:
                    for _ in range(1200):
                        if finished(tmp_path / "k3.db"):
                            break
                        await asyncio.sleep(0.1)
                    process.send_signal(signal.SIGTERM)
                    assert await asyncio.wait_for(process.wait(), 30) == 0
                    break
                if kill % 2 == 0:
                    for _ in range(400):
                        if api.answering:
                            in_flight += 1
                            break
                        await asyncio.sleep(0.02)
                else:
                    await asyncio.sleep(rng.uniform(0.2, 2.0))
                process.send_signal(signal.SIGKILL)
                await process.wait()
    return in_flight
