"""The Slack bot as one object: store, core, outbox, threads, listeners; started and stopped together."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import aiohttp
from slack_bolt.app.async_app import AsyncApp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import BotConfig, SlackConfig
from bot.coordinator import Coordinator
from bot.slack.access import Access
from bot.slack.app import build_app
from bot.slack.handlers import Handlers
from bot.slack.metrics import Metrics
from bot.slack.outbox import Outbox, slack_error
from bot.slack.tasks import TaskSet
from bot.slack.threads import Threads
from bot.store import AsyncStore
from kernel.clock import WALL
from kernel.toml_reader import ConfigError

log = logging.getLogger("k3repro.slack")

START_BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
TOKEN_ERRORS = {
    "invalid_auth",
    "not_authed",
    "token_revoked",
    "token_expired",
    "account_inactive",
    "not_allowed_token_type",
}


class SlackBot:
    def __init__(self, config: BotConfig) -> None:
        if config.slack is None:
            raise ConfigError("the bot config has no [slack] table (bot_token, signing_secret, …)")
        self.settings: SlackConfig = config.slack
        self.store = AsyncStore(config.store)
        self.client = AsyncWebClient(
            token=self.settings.bot_token,
            base_url=self.settings.api_url,
            timeout=int(max(1, self.settings.timeout_s)),
            retry_handlers=[],  # the outbox retries, off the request path
        )
        self.metrics = Metrics()
        self.core = Coordinator(config, self.store)
        self.outbox = Outbox(self.store, self.client, self.settings, self.metrics)
        self.threads = Threads(self.core, self.outbox, self.metrics)
        self.handlers = Handlers(
            self.core, Access(config, self.client), self.threads, self.outbox, self.metrics, self.settings.command
        )
        self.tasks = self.handlers.tasks = HomeTasks()  # listeners ack on the front loop (bot/web.py); work runs here
        self.app: AsyncApp | None = None
        self.not_ready = "starting: asking Slack who the bot is (auth.test)"  # what /healthz says until ready

    async def start(self) -> None:
        """Learns who the bot is (retried while Slack cannot be reached), resumes pending Slack writes, then
        the runs the store holds as active. A token Slack refuses is a ConfigError: one line, no retry."""
        self.tasks.home = asyncio.get_running_loop()
        identity = await self._identity()
        self.app = build_app(self.settings, identity, self.handlers)
        await self.outbox.start()
        resumed = await self.threads.resume_all()
        self.not_ready = ""
        log.info("Slack bot %s started; %d active run(s) resumed", identity.get("user_id"), resumed)

    async def _identity(self) -> dict[str, Any]:
        attempt = 0
        while True:
            try:
                return dict((await self.client.auth_test()).data)  # type: ignore[arg-type]
            except SlackApiError as exc:
                error = slack_error(exc)
                if error in TOKEN_ERRORS:
                    raise ConfigError(
                        f"Slack refused the bot token ({error}): set [slack] bot_token or $SLACK_BOT_TOKEN"
                        " to the app's Bot User OAuth Token (xoxb-…)"
                    ) from None
                problem = f"Slack answered auth.test with {error}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                problem = f"Slack unreachable at {self.settings.api_url} ({_one_line(exc)})"
            delay = START_BACKOFF_S[min(attempt, len(START_BACKOFF_S) - 1)]
            self.not_ready = f"{problem}; retrying in {delay:g} s"
            log.warning("%s", self.not_ready)
            await WALL.sleep(delay)
            attempt += 1

    async def idle(self) -> None:
        """Until every request, followed run and Slack write in hand is done (benchmarks, tests)."""
        await self.handlers.tasks.wait()
        await self.threads.idle()
        await self.outbox.idle()

    async def stop(self) -> None:
        """Stops following (the runs go on; the next start resumes them); unsent writes stay in the store."""
        await self.handlers.tasks.close()
        await self.threads.close()
        await self.outbox.close()
        self.store.close()


class HomeTasks(TaskSet):
    """The work after an ack, always on the bot's home loop (store, core, outbox and threads live there), whichever
    loop the listener that spawns it acked on."""

    def __init__(self) -> None:
        super().__init__()
        self.home: asyncio.AbstractEventLoop | None = None
        self._handing = 0  # spawned from another loop, not yet started here

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> Any:
        home = self.home
        if home is None or home is asyncio.get_running_loop():
            return super().spawn(work, name)
        self._handing += 1

        def start() -> None:
            self._handing -= 1
            TaskSet.spawn(self, work, name)

        home.call_soon_threadsafe(start)
        return None

    async def wait(self) -> None:
        while True:
            await super().wait()
            if not self._handing:
                return
            await WALL.sleep(0.01)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
