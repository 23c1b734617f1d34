"""The Slack bot as one object: store, core, outbox, threads, listeners; started and stopped together."""

from __future__ import annotations

import logging

from slack_bolt.app.async_app import AsyncApp
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import BotConfig, SlackConfig
from bot.coordinator import Coordinator
from bot.slack.access import Access
from bot.slack.app import build_app
from bot.slack.handlers import Handlers
from bot.slack.metrics import Metrics
from bot.slack.outbox import Outbox
from bot.slack.threads import Threads
from bot.store import AsyncStore
from runner.toml_reader import ConfigError

log = logging.getLogger("k3repro.slack")


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
        self.app: AsyncApp | None = None

    async def start(self) -> None:
        """Learns who the bot is, resumes pending Slack writes, then the runs the store holds as active."""
        identity = await self.client.auth_test()
        self.app = build_app(self.settings, dict(identity.data), self.handlers)  # type: ignore[arg-type]
        await self.outbox.start()
        resumed = await self.threads.resume_all()
        log.info("Slack bot %s started; %d active run(s) resumed", identity.get("user_id"), resumed)

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
