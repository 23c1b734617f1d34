"""The bot's HTTP face in one aiohttp application and event loop: Slack's request URL, /healthz, /metrics.

With an app-level token the same listeners also receive Socket Mode envelopes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import parse_qs

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response, to_bolt_request
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_sdk.signature import SignatureVerifier

from bot.bundle import MAX_JSON_DEPTH, too_deep
from bot.config import BotConfig
from bot.slack import socket_mode
from bot.slack.service import SlackBot
from bot.store import Store

SLACK_PATH = "/slack/events"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def web_app(bot: SlackBot) -> web.Application:
    verifier = SignatureVerifier(bot.settings.signing_secret)

    async def slack(request: web.Request) -> web.Response:
        """The signature (and its 5-minute window) is checked on the raw body before anything parses it:
        bolt parses a request's JSON when it builds its request object, before its own verification runs.
        A signed body nesting JSON deeper than MAX_JSON_DEPTH is refused in one line."""
        if bot.app is None:
            return web.Response(status=503, text="starting")
        started = time.perf_counter()
        body = await request.text()
        stamp = request.headers.get("X-Slack-Request-Timestamp", "")
        signature = request.headers.get("X-Slack-Signature", "")
        if not (stamp.isascii() and stamp.isdigit() and verifier.is_valid(body, stamp, signature)):
            response = web.json_response({"error": "invalid request"}, status=401)
        elif too_deep(_json_part(body, request.content_type)):
            response = web.Response(status=400, text=f"the request's JSON nests deeper than {MAX_JSON_DEPTH} levels")
        else:
            try:
                response = await to_aiohttp_response(await bot.app.async_dispatch(await to_bolt_request(request)))
            except RecursionError:  # not reached past the depth bound; never a traceback if it were
                response = web.Response(status=400, text="the request's JSON nests too deep")
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


def _json_part(body: str, content_type: str) -> str:
    """The JSON a Slack request carries: the body itself, or a form's `payload` field (interactivity)."""
    if content_type == "application/json":
        return body
    return "".join(parse_qs(body).get("payload", []))


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
    await bot.store.call(Store.use_retention, config.retention)  # the config's log caps; prunes old runs now
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
