"""The slack-bolt AsyncApp, built from settings (no module-level app): verification, identity, listeners."""

from __future__ import annotations

from typing import Any

from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_sdk.web.async_client import AsyncWebClient

from bot.blocks import ACTION_CANCEL, ACTION_MINIMIZE, ACTION_RERUN
from bot.config import SlackConfig
from bot.slack.handlers import Handlers


def build_app(settings: SlackConfig, identity: dict[str, Any], handlers: Handlers) -> AsyncApp:
    """`identity` is auth.test's answer, fetched once at start-up: bolt's own authorization would call
    auth.test on the first request, before its ack. The listeners write through the outbox, so bolt's
    client only carries the API base URL (Socket Mode opens its connection with it)."""
    known = AuthorizeResult(
        enterprise_id=identity.get("enterprise_id"),
        team_id=identity.get("team_id"),
        bot_user_id=identity.get("user_id"),
        bot_id=identity.get("bot_id"),
        bot_token=settings.bot_token,
    )

    async def authorize(**_: Any) -> AuthorizeResult:
        return known

    client = AsyncWebClient(base_url=settings.api_url)
    app = AsyncApp(signing_secret=settings.signing_secret, client=client, authorize=authorize, name="k3repro")
    app.command(settings.command)(handlers.on_command)
    app.action(ACTION_CANCEL)(handlers.on_action)
    app.action(ACTION_RERUN)(handlers.on_action)
    app.action(ACTION_MINIMIZE)(handlers.on_action)
    return app
