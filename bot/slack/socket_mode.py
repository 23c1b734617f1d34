"""Socket Mode: Slack delivers over a WebSocket the bot opens, so no public URL is needed.

Run exactly one bot process per app token: Slack hands each envelope to one random live connection.
"""

from __future__ import annotations

from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp


async def connect(app: AsyncApp, app_token: str) -> AsyncSocketModeHandler:
    """Opens the connection (apps.connections.open, then the WebSocket); the handler reconnects by itself."""
    handler = AsyncSocketModeHandler(app, app_token)
    await handler.connect_async()  # type: ignore[no-untyped-call]
    return handler
