"""What `/k3repro` and the run card's buttons do.

Before the ack only pure checks run (parsing, the config's clusters, channels and operator ids), so the
ack is fast; everything that needs the store, a runner or Slack runs afterwards in a task the bot owns
and answers in the run's thread or with an ephemeral message through the outbox.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bot import rich
from bot.answers import cancelled, noted, runner_line
from bot.blocks import ACTION_CANCEL, ACTION_MINIMIZE, ACTION_RERUN, MAX_MESSAGE, MAX_SECTION
from bot.config import ClusterConfig
from bot.coordinator import Coordinator
from bot.minimize import start_minimize
from bot.operations import SLACK, RegistryError, check_handled
from bot.refusal import Refused
from bot.rerun import command_line
from bot.rich import clip
from bot.slack.access import Access
from bot.slack.commands import Command, CommandError, help_text, parse
from bot.slack.metrics import Metrics
from bot.slack.outbox import Outbox, Write
from bot.slack.tasks import TaskSet
from bot.slack.threads import Threads
from bot.store import Run, RunNotFound, Store, now
from kernel.baseline import load_baseline
from kernel.toml_reader import ConfigError

log = logging.getLogger("k3repro.slack")

Ack = Callable[..., Awaitable[None]]
Work = Callable[..., Awaitable[rich.Text]]  # (handlers, request, **the command's arguments) -> the answer, or ()
HANDLERS: dict[str, Work] = {}  # operation name -> its handler, filled by @handles


def handles(name: str) -> Callable[[Work], Work]:
    """Registers the decorated method as the handler of Slack operation `name` (bot/operations.py), beside it as
    bolt registers a listener beside its matcher; the module's import checks that each has exactly one."""

    def register(work: Work) -> Work:
        if name in HANDLERS:
            raise RegistryError(f"two Slack handlers for `{name}`: {HANDLERS[name].__name__} and {work.__name__}")
        HANDLERS[name] = work
        return work

    return register


ACTIONS = {  # button -> command
    ACTION_CANCEL: ("cancel", {}),
    ACTION_RERUN: ("rerun", {"where": "isolated"}),
    ACTION_MINIMIZE: ("minimize", {}),
}


@dataclass(frozen=True)
class Request:
    """Who asked for what, where; `id` is Slack's trigger id, the same on a retried delivery."""

    id: str
    user: str
    channel: str
    team_domain: str
    command: Command


class Handlers:
    def __init__(
        self, core: Coordinator, access: Access, threads: Threads, outbox: Outbox, metrics: Metrics, slash: str
    ) -> None:
        self.core = core
        self.store = core.store
        self.access = access
        self.threads = threads
        self.outbox = outbox
        self.metrics = metrics
        self.tasks = TaskSet()
        self.slash = slash

    # --- bolt listeners ---

    async def on_command(self, ack: Ack, body: dict[str, Any]) -> None:
        try:
            command = parse(str(body.get("text", "")))
            request = Request(
                str(body.get("trigger_id") or f"{body.get('user_id')}:{now()}"),
                str(body.get("user_id", "")),
                str(body.get("channel_id", "")),
                str(body.get("team_domain", "")),
                command,
            )
            if command.operation.immediate:  # answered in the ack: pure, nothing to claim or store
                return await self._ack(ack, command.name, await HANDLERS[command.name](self, request, **command.args))
            self._precheck(command, body)
        except (CommandError, Refused) as exc:
            return await self._ack(ack, "refused", refusal(exc))
        starting = rich.text(f"⏳ starting a run on {command.args['cluster']}…") if command.name == "start" else ()
        await self._ack(ack, "accepted", starting)
        self.tasks.spawn(self._handle(request), name=f"slack {command.name} {request.id}")

    async def on_action(self, ack: Ack, body: dict[str, Any]) -> None:
        await self._ack(ack, "action", ())
        action = (body.get("actions") or [{}])[0]
        request = Request(
            str(body.get("trigger_id") or action.get("action_ts", "")),
            str((body.get("user") or {}).get("id", "")),
            str((body.get("channel") or {}).get("id", "")),
            str((body.get("team") or {}).get("domain", "")),
            Command(
                ACTIONS[action["action_id"]][0],
                {"run": str(action.get("value", "")), **ACTIONS[action["action_id"]][1]},
            ),
        )
        self.tasks.spawn(self._handle(request), name=f"slack button {request.command.name} {request.id}")

    async def _ack(self, ack: Ack, answer: str, body: rich.Text) -> None:
        self.metrics.inc("k3repro_slack_requests_total", answer=answer)
        await (ack(text=rich.mrkdwn(body, MAX_MESSAGE), response_type="ephemeral") if body else ack())

    def _precheck(self, command: Command, body: dict[str, Any]) -> None:
        """The checks the config alone decides: a known cluster; for changes, its channel and its operators."""
        name = command.args.get("cluster")
        if name is None:
            return
        cluster = self.access.cluster(name)
        if command.operation.operates:
            self.access.check_place(cluster, str(body.get("channel_id", "")))
            if self.access.known_operator(cluster, str(body.get("user_id", ""))) is False:
                raise Refused(f"<@{body.get('user_id')}> is not an operator of cluster {cluster.name}")

    # --- after the ack ---

    async def _handle(self, request: Request) -> None:
        if not await self.store.call(Store.claim_request, request.id):
            log.info("request %s was already handled (a retry); ignored", request.id)
            return
        work = HANDLERS[request.command.name]
        try:
            answer = await work(self, request, **request.command.args)
        except (Refused, RunNotFound) as exc:
            answer = refusal(exc)
        except Exception:
            reference = uuid.uuid4().hex[:12]
            log.exception("request %s (%s) failed; reference %s", request.id, request.command.name, reference)
            answer = rich.text(
                "⚠️ that failed inside the bot (reference ",
                rich.code(reference),
                " in its log); nothing else was changed",
            )
        if answer:
            await self._ephemeral(request, answer)

    async def _ephemeral(self, request: Request, answer: rich.Text) -> None:
        args = {"channel": request.channel, "user": request.user, "text": rich.mrkdwn(answer, MAX_MESSAGE)}
        await self.outbox.put(Write(f"ephemeral:{request.id}", "chat.postEphemeral", args))

    async def _operator(self, request: Request, cluster_name: str) -> ClusterConfig:
        cluster = self.access.cluster(cluster_name)
        self.access.check_place(cluster, request.channel)
        await self.access.check_operator(cluster, request.user)
        return cluster

    @handles("start")
    async def _start(self, request: Request, cluster: str, profile: str = "", image: str = "") -> rich.Text:
        await self._operator(request, cluster)
        try:
            started = await self.core.start(
                cluster, request.user, "slack", place=request.channel, profile=profile, image=image
            )
        except Refused:
            active = await self.store.call(Store.active_run, cluster)
            if active is None:
                raise
            already = rich.text(f"⛔ {cluster} already has an active run, ", rich.code(active.id), ": ")
            return already + await self._link(active.id)
        await self.threads.open(started, request.channel, request.team_domain)
        return ()

    async def _readable(self, request: Request) -> tuple[str, ...]:
        """The clusters `status` and `runs` answer about here (Access.readable_clusters); none is a refusal."""
        clusters = await self.access.readable_clusters(request.channel, request.user)
        if not clusters:
            raise Refused(
                "`status` and `runs` show a cluster's runs in its channels, to its operators (as `start`);"
                " this channel or user has none"
            )
        return clusters

    @handles("status")
    async def _status(self, request: Request, run: str = "") -> rich.Text:
        clusters = await self._readable(request)
        if run:
            found = await self.store.call(Store.get_run, run, clusters)
            rows = [found]
        else:
            rows = [row for row in await self.store.call(Store.active_runs) if row.cluster in clusters]
            if not rows:
                return rich.text("no run is active; ", rich.code(f"{self.slash} runs"), " lists the latest")
        # a run whose follower died (a terminal's start killed mid-run) is read from its runner, not left active
        rows = [await self.core.settle(row) for row in rows]
        return rich.joined([await self._run_line(row) for row in rows])

    @handles("runs")
    async def _runs(self, request: Request) -> rich.Text:
        clusters = await self._readable(request)
        rows = [await self.core.settle(row) for row in await self.store.call(Store.runs, 10, (), clusters)]
        return rich.joined([await self._run_line(row) for row in rows]) or rich.text("no runs yet")

    @handles("cancel")
    async def _cancel(self, request: Request, run: str) -> rich.Text:
        found = await self.store.call(Store.get_run, run)
        await self._operator(request, found.cluster)
        result = await self.core.cancel(found.id, request.user, "slack", place=request.channel, by=f"<@{request.user}>")
        return cancelled(result)

    @handles("rerun")
    async def _rerun(self, request: Request, run: str, where: str) -> rich.Text:
        """Launches the cluster's configured command (bot/rerun.py, configured_launch), which the answer shows."""
        found = await self.store.call(Store.get_run, run)
        cluster = await self._operator(request, found.cluster)
        answer = await self.threads.rerun(found.id, request.user, request.channel)
        return answer + rich.text("\nit launches: ", _launches(cluster.launch_argv))

    @handles("minimize")
    async def _minimize(self, request: Request, run: str) -> rich.Text:
        """A run of its own, with its own card and thread; the original's thread is told where it went."""
        found = await self.store.call(Store.get_run, run)
        await self._operator(request, found.cluster)
        started = await start_minimize(self.core, found.id, request.user, via="slack", place=request.channel)
        await self.threads.open(started, request.channel, request.team_domain)
        note = rich.text("🔬 minimize run ", rich.code(started.run_id), " started by ", rich.mention(request.user))
        note += rich.text(": its own thread has the search\nit launches: ", _launches(started.request.launch_argv))
        await self.threads.note_in_thread(found.id, request.channel, note, f"minimize:{started.run_id}")
        return ()

    @handles("runners")
    async def _runners(self, request: Request, cluster: str = "") -> rich.Text:
        """Each runner for anyone; where it listens only for the cluster's operators (answers.runner_line)."""
        states = await self.core.runners(cluster or None)
        operates = {name: await self.access.is_operator(self.access.cluster(name), request.user) for name, _ in states}
        lines = [runner_line(name, state, private=operates[name]) for name, state in states]
        if lines and not all(operates.values()):
            lines.append(rich.text(rich.italic("addresses are shown to the cluster's operators")))
        return rich.joined(lines) or rich.text("no runners configured")

    @handles("baseline")
    async def _baseline(self, request: Request, profile: str = "") -> rich.Text:
        profiles = sorted({c.profile for c in self.core.config.clusters.values() if c.profile})
        name = profile or (profiles[0] if len(profiles) == 1 else "")
        if not name:
            return rich.text(
                "which profile? ", rich.code("baseline PROFILE"), f"; the clusters use: {', '.join(profiles) or 'none'}"
            )
        try:
            baseline = load_baseline(name)
        except ConfigError as exc:
            raise Refused(str(exc)) from None
        rules = [
            rich.text("• ", rich.code(rule.id), f" ({rule.severity}) {rule.description}") for rule in baseline.rules
        ]
        head = rich.text(
            rich.bold(f"baseline {baseline.name}"), f" — {baseline.description}" if baseline.description else ""
        )
        return rich.joined([head, *rules, rich.text(rich.italic("every run checks it in its baseline stage"))])

    @handles("note")
    async def _note(self, request: Request, cluster: str, text: str) -> rich.Text:
        await self._operator(request, cluster)
        change = await self.core.note(cluster, text, request.user, "slack", place=request.channel)
        return noted(change)

    @handles("help")
    async def _help(self, request: Request) -> rich.Text:
        return help_text(self.slash)

    async def _run_line(self, run: Run) -> rich.Text:
        decision = f" · {run.decision}" if run.decision else ""
        return rich.text("• ", rich.code(run.id), f" {run.cluster} · {run.status}{decision} · ") + await self._link(
            run.id
        )

    async def _link(self, run_id: str) -> rich.Text:
        thread = await self.store.call(Store.thread, run_id)
        if thread is None:
            return rich.text("started from the terminal")
        if not thread.parent_ts:
            return rich.text("thread in ", rich.channel(thread.channel), " (being posted)")
        ts = thread.parent_ts.replace(".", "")
        if thread.team_domain:
            url = f"https://{thread.team_domain}.slack.com/archives/{thread.channel}/p{ts}"
            return rich.text(rich.link(f"thread in #{thread.channel}", url))
        return rich.text("thread ", rich.channel(thread.channel), f" ts {thread.parent_ts}")


check_handled(SLACK, HANDLERS)


def refusal(exc: Exception) -> rich.Text:
    """A refusal in one line; a person the bot named in it (`<@U1>`) stays a mention, all else is shown as written."""
    return rich.text("⛔ ", *rich.mentioning(str(exc)))


def _launches(argv: Sequence[str]) -> rich.Span:
    """A launch command, redacted, as inline code short enough for a section."""
    return rich.code(clip(command_line(argv), MAX_SECTION - 200))
