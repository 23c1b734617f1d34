"""Ack latency of the Slack endpoint: N signed slash commands, C at a time, against a bare aiohttp endpoint.

The bot's path is signature check → bolt → parse and config checks → ack, with the post-ack work (store,
outbox, the local Slack answering) running alongside. The reference in the same run is an aiohttp handler
that answers at once on the same loop and client, so the ratio is what the bot adds. Target: p99 < 100 ms.
Run: `.venv/bin/python -m bench.bench_slack_ack [N] [C]`.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from bot.web import SLACK_PATH, serving
from tests.k3fixtures import bot_config
from tests.slack_api import SlackApi, command_body, signed, slack_config

COMMANDS = ("runs", "status", "help", "start cluster-z", "runners cluster-z")


async def load(url: str, n: int, concurrency: int, request: Callable[[int], tuple[str, dict[str, str]]]) -> list[float]:
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(i: int) -> None:
            body, headers = request(i)
            async with gate:
                started = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    assert response.status == 200, response.status
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(one(i) for i in range(n)))
    return latencies


def signed_command(i: int) -> tuple[str, dict[str, str]]:
    body = command_body(COMMANDS[i % len(COMMANDS)], trigger=f"bench-{i}")
    return body, {"Content-Type": "application/x-www-form-urlencoded", **signed(body)}


async def bench(n: int, concurrency: int, workdir: Path) -> tuple[list[float], list[float]]:
    api = await SlackApi().start()
    config = slack_config(bot_config(None, workdir / "k3.db", ["127.0.0.1:9"]), api)
    async with serving(config, port=0) as served:
        await load(f"http://127.0.0.1:{served.port}{SLACK_PATH}", concurrency, concurrency, signed_command)  # warm-up
        bot = await load(f"http://127.0.0.1:{served.port}{SLACK_PATH}", n, concurrency, signed_command)
        await served.bot.idle()

    async def bare(_: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/", bare)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    await load(url, concurrency, concurrency, signed_command)
    reference = await load(url, n, concurrency, signed_command)
    await runner.cleanup()
    await api.stop()
    return bot, reference


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    concurrency = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    with tempfile.TemporaryDirectory() as tmp:
        bot, reference = asyncio.run(bench(n, concurrency, Path(tmp)))
    print(f"{n} signed slash commands ({', '.join(COMMANDS)}), {concurrency} concurrent")
    print(f"bot endpoint (verify, bolt, ack):  p50 {percentile(bot, 50):6.1f} ms   p99 {percentile(bot, 99):6.1f} ms")
    print(
        f"bare aiohttp handler (reference):  p50 {percentile(reference, 50):6.1f} ms   p99 {percentile(reference, 99):6.1f} ms"
    )
    for q in (50, 99):
        print(f"ratio p{q} (bot / reference):       {percentile(bot, q) / percentile(reference, q):.1f}")
    print(f"target p99 < 100 ms:               {'met' if percentile(bot, 99) < 100 else 'NOT met'}")


if __name__ == "__main__":
    main()
