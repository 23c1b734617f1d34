"""The bot's HTTP face in one aiohttp application and event loop: Slack's request URL, /healthz, /metrics.

With an app-level token the same listeners also receive Socket Mode envelopes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler

from bot.config import BotConfig
from bot.slack import socket_mode
from bot.slack.service import SlackBot
from bot.store import Store

SLACK_PATH = "/slack/events"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def web_app(bot: SlackBot) -> web.Application:
    async def slack(request: web.Request) -> web.Response:
        if bot.app is None:
            return web.Response(status=503, text="starting")
        started = time.perf_counter()
        response = await to_aiohttp_response(await bot.app.async_dispatch(await to_bolt_request(request)))
        bot.metrics.inc("k3repro_slack_http_seconds_total", time.perf_counter() - started)
        bot.metrics.inc("k3repro_slack_http_requests_total", status=str(response.status))
        return response

    async def healthz(_: web.Request) -> web.Response:
        if bot.not_ready:
            return web.json_response({"ok": False, "why": bot.not_ready}, status=503)
        return web.json_response({"ok": True})

    async def metrics(_: web.Request) -> web.Response:
        pending = await bot.store.call(Store.pending_count)
        text = bot.metrics.render({"k3repro_slack_outbox_pending": float(pending)})
        return web.Response(body=text.encode(), headers={"Content-Type": PROMETHEUS_TEXT})

    app = web.Application()
    app.router.add_post(SLACK_PATH, slack)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app


@dataclass(frozen=True)
class Served:
    bot: SlackBot
    port: int
    started: asyncio.Task[None]  # the bot's start (auth.test retried, resume), then Socket Mode


@asynccontextmanager
async def serving(config: BotConfig, port: int | None = None, *, ready: bool = True) -> AsyncIterator[Served]:
    """HTTP at the bot's `listen` address (or `port`) at once, so /healthz can say why the bot is not ready;
    the bot's start alongside (awaited before yielding when `ready`), then Socket Mode when configured."""
    bot = SlackBot(config)
    runner = web.AppRunner(web_app(bot))
    socket: list[AsyncSocketModeHandler] = []

    async def start() -> None:
        await bot.start()
        if bot.settings.app_token and bot.app is not None:
            socket.append(await socket_mode.connect(bot.app, bot.settings.app_token))

    try:
        await runner.setup()
        host, _, listen_port = bot.settings.listen.rpartition(":")
        site = web.TCPSite(runner, host or None, int(listen_port) if port is None else port)
        await site.start()
        started = asyncio.get_running_loop().create_task(start(), name="slack bot start")
        try:
            if ready:
                await asyncio.shield(started)
            yield Served(bot, int(runner.addresses[0][1]), started)
        finally:
            started.cancel()
            await asyncio.gather(started, return_exceptions=True)
    finally:
        for handler in socket:
            await handler.close_async()  # type: ignore[no-untyped-call]
        await runner.cleanup()
        await bot.stop()
