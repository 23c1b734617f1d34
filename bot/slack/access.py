"""Who may change what, and where: per cluster, the channels runs may be started in and the operators.

Operators are Slack user ids (U…, W…) or user-group ids (S…). The config-only checks are pure (they run
before the ack); only a user-group membership needs Slack, and is cached.
"""

from __future__ import annotations

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import BotConfig, ClusterConfig
from bot.refusal import Refused
from bot.slack.outbox import slack_error
from kernel.clock import WALL, WallClock
from kernel.toml_reader import ConfigError

GROUP_TTL_S = 300.0


class Access:
    def __init__(self, config: BotConfig, client: AsyncWebClient, clock: WallClock = WALL) -> None:
        self.config = config
        self.client = client
        self.clock = clock  # how long a user group's members are trusted (GROUP_TTL_S)
        self._groups: dict[str, tuple[float, frozenset[str]]] = {}

    def cluster(self, name: str) -> ClusterConfig:
        try:
            return self.config.cluster(name)
        except ConfigError as exc:
            raise Refused(str(exc)) from None

    def check_place(self, cluster: ClusterConfig, channel: str) -> None:
        if channel in cluster.channels:
            return
        where = ", ".join(f"<#{c}>" for c in cluster.channels)
        raise Refused(
            f"cluster {cluster.name} can only be operated from {where}"
            if where
            else f"cluster {cluster.name} has no Slack channel configured (`channels` in k3repro.toml)"
        )

    def known_operator(self, cluster: ClusterConfig, user: str) -> bool | None:
        """True/False when the config alone decides; None when a user group must be asked."""
        if user in cluster.operators:
            return True
        return None if self._group_ids(cluster) else False

    async def check_operator(self, cluster: ClusterConfig, user: str) -> None:
        decided = self.known_operator(cluster, user)
        for group in self._group_ids(cluster) if decided is None else ():
            if user in await self._members(group):
                return
        if not decided:
            raise Refused(f"<@{user}> is not an operator of cluster {cluster.name}; ask one of its operators")

    async def is_operator(self, cluster: ClusterConfig, user: str) -> bool:
        """check_operator as a yes/no: a user-group lookup that fails counts as no."""
        try:
            await self.check_operator(cluster, user)
        except Refused:
            return False
        return True

    async def readable_clusters(self, channel: str, user: str) -> tuple[str, ...]:
        """The clusters whose runs `status` and `runs` show to `user` in `channel`: start's rules, those the
        channel is configured for and the user operates (a user-group lookup that fails counts as no)."""
        clusters = [c for c in self.config.clusters.values() if channel in c.channels]
        return tuple([c.name for c in clusters if await self.is_operator(c, user)])

    @staticmethod
    def _group_ids(cluster: ClusterConfig) -> list[str]:
        return [ident for ident in cluster.operators if ident.startswith("S")]

    async def _members(self, group: str) -> frozenset[str]:
        cached = self._groups.get(group)
        if cached is not None and self.clock.monotonic() - cached[0] < GROUP_TTL_S:
            return cached[1]
        try:
            answer = await self.client.usergroups_users_list(usergroup=group)
        except SlackApiError as exc:
            raise Refused(f"cannot check membership of user group {group}: {slack_error(exc)}") from None
        members = frozenset(answer.get("users") or [])
        self._groups[group] = (self.clock.monotonic(), members)
        return members
