"""One Slack thread per run: the card in the channel, the live checklist, a message per stage, the verdict.

Each event folds into the run's record (bot/record.py) and becomes outbox writes with stable keys, so replaying
a run's stored events after a restart rebuilds the record and re-enqueues nothing that was already written.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from bot import blocks, rich, timeline
from bot.blocks import MINIMAL, Message
from bot.bundle import BundleError, export_bundle
from bot.consumer import EventCallback, RunLost, RunRefused
from bot.coordinator import Coordinator, StartedRun
from bot.isolation import Placement
from bot.record import Check, Finished, PhaseReached, RunRecord, StageResult, StageStarted
from bot.rerun import RerunOutcome, command_line, rerun_isolated, verdict_lines
from bot.resume import Shown, resume_active
from bot.slack.metrics import Metrics
from bot.slack.outbox import UPLOAD, Outbox, Write, file_content
from bot.slack.tasks import TaskSet
from bot.store import AsyncStore, RerunVerdict, Run, Store
from protos import runner_pb2 as pb

log = logging.getLogger("k3repro.slack.threads")

VERDICT_MARK = {RerunVerdict.REPRODUCED: "🎯", RerunVerdict.NOT_REPRODUCED: "🌱", RerunVerdict.DIFFERENT_FAILURE: "🔀"}
REFRESH_ON = (StageStarted, PhaseReached, Check, StageResult, Finished, pb.Artifact)  # what the card or checklist show


class Threads:
    def __init__(self, core: Coordinator, outbox: Outbox, metrics: Metrics) -> None:
        self.core = core
        self.store: AsyncStore = core.store
        self.outbox = outbox
        self._tasks = TaskSet()
        self._shown: dict[str, str] = {}  # run id -> key of its latest thread message: final states wait for it
        self._queued: dict[
            str, dict[str, Any]
        ] = {}  # update key -> the state last queued (an unchanged one is skipped)
        metrics.gauge("k3repro_runs_followed", lambda: float(len(self._tasks)))

    async def open(self, started: StartedRun, channel: str, team_domain: str) -> None:
        """Posts the run's card and checklist, then follows the run into its thread."""
        try:
            await self.store.call(Store.create_thread, started.run_id, channel, team_domain)
            view = RunRecord.of(await self.store.call(Store.get_run, started.run_id))
            await self._begin(view, channel)
        except BaseException:
            await started.abandon()  # the run goes on: the bot's resume follows it into its thread
            raise

        async def follow() -> None:
            try:
                await self.core.follow(started, self._shown_in(view, channel))
            except (RunLost, RunRefused) as exc:
                await self._lost(view, channel, exc)

        self._tasks.spawn(follow(), name=f"follow {view.run_id}")

    async def resume_all(self) -> int:
        """Follows every run the store holds as active (the one resume path, bot/resume.py); a run with a
        thread continues in it, and an isolated rerun's verdict goes to its original's thread."""
        follows = await resume_active(self.core, self._resumed)
        for run_id, follow in follows.items():
            self._tasks.spawn(follow, name=f"follow {run_id}")
        return len(follows)

    async def _resumed(self, run: Run) -> Shown:
        """A resumed run's thread as it was: its card and checklist, its stored events replayed (their keys
        make what is in Slack already a no-op); a rerun a stopped bot had started tells its original's thread."""
        if run.rerun_of:
            post = await self._poster(run.rerun_of, "")
            return Shown(
                verdict=functools.partial(_post_verdict, post),
                failed=functools.partial(_no_verdict, post, run.rerun_of, run.id),
            )
        thread = await self.store.call(Store.thread, run.id)
        view = RunRecord.of(run)
        channel = thread.channel if thread else ""
        if channel:
            await self._begin(view, channel)
            for event in await self.store.call(Store.events, run.id):
                await self._on_event(view, channel, event)
        return Shown(on_event=self._shown_in(view, channel), failed=functools.partial(self._lost, view, channel))

    async def _begin(self, view: RunRecord, channel: str) -> None:
        """The card and the checklist's first post; their keys make a second call (on resume) a no-op."""
        card, checklist = self._card(view), blocks.checklist(view)
        card_args = {"channel": channel, **card.args(), "metadata": blocks.metadata(view)}
        await self.outbox.put(
            Write(f"{view.run_id}:card", "chat.postMessage", card_args, view.run_id, creates="parent_ts")
        )
        checklist_args = {"channel": channel, **checklist.args()}
        await self.outbox.put(
            Write(
                f"{view.run_id}:checklist",
                "chat.postMessage",
                checklist_args,
                view.run_id,
                thread=True,
                creates="checklist_ts",
            )
        )

    def _card(self, view: RunRecord) -> Message:
        """The run's card; its Rerun and Minimize buttons show the command they launch (the cluster's configured
        one, redacted) in a confirmation dialog."""
        cluster = self.core.config.clusters.get(view.cluster)
        card = blocks.card(view)
        return blocks.confirm_launches(card, view.cluster, command_line(cluster.launch_argv)) if cluster else card

    async def rerun(self, run_id: str, user: str, channel: str) -> rich.Text:
        """Starts an isolated rerun of a run; its start, then its verdict and environment differences, go to
        the ORIGINAL run's thread. A refusal (nothing started) is raised to the caller, as Refused."""
        placed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        post = await self._poster(run_id, channel)

        async def started(rerun_id: str, placement: Placement) -> None:
            body = rich.text("🧪 isolated rerun ", rich.code(rerun_id), f" started on {placement.where}, by ")
            body += (rich.mention(user),)
            await post(f"{run_id}:rerun:{rerun_id}:start", blocks.fit(rich.mrkdwn(body), [rich.Section(body)]))
            placed.set_result(rerun_id)

        async def work() -> None:
            try:
                outcome = await rerun_isolated(
                    self.core, run_id, user, _ignore, via="slack", place=channel, on_started=started
                )
            except Exception as exc:
                if not placed.done():  # nothing was started: the one who asked hears why
                    placed.set_exception(exc)
                    return
                if not isinstance(exc, RunLost | RunRefused):
                    raise
                await _no_verdict(post, run_id, placed.result(), exc)
                return
            finally:
                placed.cancel()  # a no-op once placed; otherwise (the bot stopping) the asker stops waiting
            await _post_verdict(post, outcome)

        self._tasks.spawn(work(), name=f"rerun of {run_id}")
        rerun_id = await placed
        return rich.text(
            "🧪 isolated rerun ", rich.code(rerun_id), " started; its verdict goes to the thread of ", rich.code(run_id)
        )

    async def _poster(self, run_id: str, channel: str) -> Post:
        """Posts into run_id's thread (or, without one, to `channel`); keys make a repeated post a no-op."""
        thread = await self.store.call(Store.thread, run_id)
        where = {"channel": thread.channel if thread else channel}

        async def post(key: str, message: Message) -> None:
            if not where["channel"]:  # a run started from the terminal, resumed: no Slack place to tell
                return
            args = {**where, **message.args()}
            await self.outbox.put(Write(key, "chat.postMessage", args, run_id if thread else "", thread=bool(thread)))

        return post

    async def note_in_thread(self, run_id: str, channel: str, body: rich.Text, key: str) -> None:
        """One line in a run's thread (once per `key`), e.g. where a minimize run of it went."""
        post = await self._poster(run_id, channel)
        await post(f"{run_id}:{key}", blocks.fit(rich.mrkdwn(body), [rich.Section(body)]))

    async def idle(self) -> None:
        await self._tasks.wait()

    async def close(self) -> None:
        await self._tasks.close()

    def _shown_in(self, view: RunRecord, channel: str) -> EventCallback:
        """A followed run's events into its thread; a run without one (started from the terminal): none."""

        async def on_event(event: pb.RunEvent) -> None:
            if channel:
                await self._on_event(view, channel, event)

        return on_event

    async def _lost(self, view: RunRecord, channel: str, exc: Exception) -> None:
        """The bot stopped following (the runner refused the run, or contact was lost): the thread says so."""
        view.lost((await self.store.call(Store.get_run, view.run_id)).status, str(exc))
        if channel:
            await self._post_message(view, channel, f"{view.run_id}:problem", blocks.problem(view))
            await self._refresh(view, channel)

    async def _on_event(self, view: RunRecord, channel: str, event: pb.RunEvent) -> None:
        fact = view.apply(event)
        key = f"{view.run_id}:{event.seq}"
        # one message per stage (the ladder's lists its steps); evidence files are gathered in the bundle
        if isinstance(fact, StageResult) and fact.stage != "verdict":  # the run's verdict says it
            await self._post_message(view, channel, key, blocks.stage_result(view, fact))
        elif isinstance(fact, Finished):
            await self._post_message(view, channel, key, blocks.verdict(view, fact), reply_broadcast=True)
            if view.minimize_of and MINIMAL in view.artifacts:  # the original's thread gets the result too
                post = await self._poster(view.minimize_of, channel)
                result = blocks.minimal_blocks(view.artifacts[MINIMAL])
                text = f"🔬 minimize run {view.run_id}: the 1-minimal failing command"
                await post(f"{view.minimize_of}:minimized:{view.run_id}", blocks.fit(text, result))
        if isinstance(fact, REFRESH_ON):
            await self._refresh(view, channel)
        if isinstance(fact, Finished):  # once the final card is queued: drawing must not hold "completed" back
            await self._verdict_files(view, channel, fact)

    async def _verdict_files(self, view: RunRecord, channel: str, fact: Finished) -> None:
        """After the verdict, two files: the timeline picture, and the run's bundle (every log, the scene, the
        baseline, the report: what `k3repro bundle export` writes, redacted)."""
        picture = await self._timeline(view, fact)
        await self._upload(view, channel, f"{view.run_id}:timeline", f"timeline-{view.run_id}.png", "timeline", picture)
        try:
            bundle = await self.store.call(export_bundle, view.run_id, (fact.status, fact.decision or None))
        except BundleError as exc:
            log.warning("run %s: no bundle for its thread: %s", view.run_id, exc)
            return
        name = f"k3repro-{view.run_id}.tar.gz"
        await self._upload(view, channel, f"{view.run_id}:bundle", name, "bundle", bundle.to_bytes())

    async def _post_message(
        self, view: RunRecord, channel: str, key: str, message: Message, *, reply_broadcast: bool = False
    ) -> None:
        args = {"channel": channel, **message.args(), "reply_broadcast": reply_broadcast}
        await self.outbox.put(Write(key, "chat.postMessage", args, view.run_id, thread=True))
        self._shown[view.run_id] = key
        if message.overflow:
            await self._upload(
                view, channel, f"{key}:full", f"{key.replace(':', '-')}.txt", "full text", message.overflow
            )

    async def _timeline(self, view: RunRecord, fact: Finished) -> bytes:
        """The run's picture from its record's launches, drawn off the event loop: matplotlib takes a few
        hundred ms, and the loop serves Slack's acks meanwhile."""
        title = timeline.caption(view.run_id, view.cluster, fact.decision or fact.status or "")
        return await asyncio.to_thread(timeline.png, list(view.launches), title)

    async def _upload(
        self, view: RunRecord, channel: str, key: str, filename: str, title: str, content: str | bytes
    ) -> None:
        args = {"channel": channel, "filename": filename, "title": title}
        await self.outbox.put(Write(key, UPLOAD, args, view.run_id, thread=True, extra=file_content(content)))

    async def _refresh(self, view: RunRecord, channel: str) -> None:
        """The latest card and checklist, each in its own slot (the outbox keeps only the newest of each until
        it is sent); a final state goes out only once the thread shows the run's last message (no "completed"
        card before the verdict is in Slack); a state equal to the one already queued is not queued again."""
        card, checklist = self._card(view), blocks.checklist(view)
        for name, message, extra in (
            ("card", card, {"metadata": blocks.metadata(view)}),
            ("checklist", checklist, {}),
        ):
            key, args = f"{view.run_id}:{name}:update", {"channel": channel, **message.args(), **extra}
            if self._queued.get(key) == args:
                continue
            self._queued[key] = args
            target = "parent_ts" if name == "card" else "checklist_ts"
            after = self._shown.get(view.run_id, "") if view.final else ""
            await self.outbox.put(Write(key, "chat.update", args, view.run_id, target=target, after=after))
        if view.final:
            self._forget(view.run_id)

    def _forget(self, run_id: str) -> None:
        self._shown.pop(run_id, None)
        for name in ("card", "checklist"):
            self._queued.pop(f"{run_id}:{name}:update", None)


Post = Callable[[str, Message], Awaitable[None]]


async def _ignore(event: pb.RunEvent) -> None:
    """A rerun has its own record (`status RUN`); the original's thread gets its verdict."""


async def _post_verdict(post: Post, outcome: RerunOutcome) -> None:
    lines = verdict_lines(outcome)
    verdict = outcome.comparison["verdict"]
    mark = VERDICT_MARK[verdict] if verdict else "⚠️"
    head, details = blocks.section(f"{mark} ", rich.bold(lines[0])), blocks.section(rich.fence(lines[1:]))
    message = blocks.fit(lines[0], [head, details])
    await post(f"{outcome.original_id}:rerun:{outcome.run_id}:verdict", message)


async def _no_verdict(post: Post, original_id: str, rerun_id: str, exc: Exception) -> None:
    body = rich.text("⚠️ isolated rerun ", rich.code(rerun_id), f" ended without a verdict: {exc}")
    await post(f"{original_id}:rerun:{rerun_id}:problem", blocks.fit(rich.mrkdwn(body), [rich.Section(body)]))
