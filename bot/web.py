"""The bot's HTTP face in one aiohttp application: Slack's request URL, /healthz, /metrics.

It runs on an event loop of its own, in its own thread (FrontLoop): a request is verified, dispatched by bolt
and acked there, so an ack never waits behind the runs the bot follows on its home loop (their events folded,
rendered and stored as they stream). The work after an ack is handed to the home loop (SlackBot's tasks).
With an app-level token the same listeners also receive Socket Mode envelopes, on the same front loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
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
from kernel.clock import WALL

SLACK_PATH = "/slack/events"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
T = TypeVar("T")


class FrontLoop:
    """An event loop in a thread of its own, for the requests Slack waits on (acks); `shared`: the caller's loop
    instead (the old arrangement, kept as a benchmark's reference)."""

    def __init__(self, shared: bool = False) -> None:
        self._shared = shared
        self.loop = asyncio.get_running_loop() if shared else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="k3repro-slack-front", daemon=True)
        if not shared:
            self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Runs `work` on the front loop and waits for it from the caller's."""
        if self._shared:
            return await work
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    def close(self) -> None:
        if self._shared:
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


def web_app(bot: SlackBot) -> web.Application:
    verifier = SignatureVerifier(bot.settings.signing_secret)

    async def slack(request: web.Request) -> web.Response:
        """The signature (and its 5-minute window) is checked on the raw body before anything parses it:
        bolt parses a request's JSON when it builds its request object, before its own verification runs.
        A signed body nesting JSON deeper than MAX_JSON_DEPTH is refused in one line."""
        if bot.app is None:
            return web.Response(status=503, text="starting")
        started = WALL.monotonic()
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
        bot.metrics.inc("k3repro_slack_http_seconds_total", WALL.monotonic() - started)
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
async def serving(
    config: BotConfig, port: int | None = None, *, ready: bool = True, shared_loop: bool = False
) -> AsyncIterator[Served]:
    """HTTP at the bot's `listen` address (or `port`) at once, so /healthz can say why the bot is not ready;
    the bot's start alongside (awaited before yielding when `ready`), then Socket Mode when configured. Requests
    are served on a front loop of their own (`shared_loop`: on this one, as before; a benchmark's reference)."""
    bot = SlackBot(config)
    await bot.store.call(Store.use_retention, config.retention)  # the config's log caps; prunes old runs now
    front = FrontLoop(shared=shared_loop)
    socket: list[AsyncSocketModeHandler] = []
    runners: list[web.AppRunner] = []

    async def start() -> None:
        await bot.start()
        if bot.settings.app_token and bot.app is not None:
            socket.append(await front.call(socket_mode.connect(bot.app, bot.settings.app_token)))

    async def listen() -> int:
        runner = web.AppRunner(web_app(bot))
        runners.append(runner)
        await runner.setup()
        host, _, listen_port = bot.settings.listen.rpartition(":")
        await web.TCPSite(runner, host or None, int(listen_port) if port is None else port).start()
        return int(runner.addresses[0][1])

    async def close() -> None:
        for handler in socket:
            await handler.close_async()  # type: ignore[no-untyped-call]
        for runner in runners:
            await runner.cleanup()

    try:
        bound = await front.call(listen())
        started = asyncio.get_running_loop().create_task(start(), name="slack bot start")
        try:
            if ready:
                await asyncio.shield(started)
            yield Served(bot, bound, started)
        finally:
            started.cancel()
            await asyncio.gather(started, return_exceptions=True)
    finally:
        await front.call(close())
        front.close()
        await bot.stop()
