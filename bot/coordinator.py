"""Bot core: turns "start a run on cluster X" into a dispatched, stored, followed run; and cancels runs."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import grpc

from bot.answers import Cancelled
from bot.config import BotConfig, ClusterConfig
from bot.consumer import EventCallback, LiveStream, ReconnectCallback, RunLost, RunRefused, accept, follow_run
from bot.dispatcher import DispatchError, RunnerState, pick_runner, survey
from bot.ids import new_run_id
from bot.refusal import Refused
from bot.runner_client import open_channel, rpc_error_text
from bot.store import ACTIVE, ActiveRunExists, AsyncStore, Change, Run, Store
from kernel.toml_reader import ConfigError
from kernel.vllm_cli import LaunchCommandError, parse_launch_command
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc

MAX_NOTE_CHARS = 500


@dataclass(frozen=True)
class StartedRun:
    """A run its runner accepted: `first` is its first event, stored already; `live` the StartRun stream it came
    on, which `Coordinator.follow` reads on from (one RPC stream per run). Not followed: `abandon` closes it."""

    run_id: str
    runner: str
    request: pb.StartRunRequest
    first: pb.RunEvent
    live: LiveStream | None = field(default=None, compare=False, repr=False)

    async def abandon(self) -> None:
        """Closes the stream no one will follow (the run goes on; `resume` or `watch` follows it later)."""
        if self.live is not None:
            await self.live.close()


class Coordinator:
    def __init__(self, config: BotConfig, store: AsyncStore) -> None:
        self.config = config
        self.store = store
        self.following: set[str] = set()  # runs this process streams: settle leaves them to their follower

    async def start(
        self,
        cluster_name: str,
        requested_by: str,
        via: str = "cli",
        *,
        place: str = "",
        profile: str = "",
        image: str = "",
        deployment_error: pb.FirstError | None = None,
        argv: list[str] | None = None,
        fixed: pb.FixedRequest | None = None,
        minimize: pb.Minimize | None = None,
    ) -> StartedRun:
        """Validates, dispatches and records a run, and returns once its runner has accepted it (its first event);
        `follow` then streams it. A refusal, the runner's included, leaves only its audit line. `profile`/`image`
        override the cluster's for this run (the runner still checks the image against its allowlist);
        `deployment_error` is the first error of the failing deployment's own log, which freeze records; `argv`
        and `fixed` the cluster's launch command and fixed request (a minimize run sends what its original sent)."""
        cluster, launch_argv = self._cluster(cluster_name, argv)
        runner = await self._runner(cluster)
        request = await self._request(
            cluster,
            launch_argv,
            requested_by,
            profile=profile,
            image=image,
            deployment_error=deployment_error,
            fixed=fixed,
            minimize=minimize,
        )
        await self._reserve(request, runner.address, minimize)
        return await self._ask(request, runner.address, via, place)

    def _cluster(self, cluster_name: str, argv: list[str] | None) -> tuple[ClusterConfig, list[str]]:
        """The cluster and the launch command the run is to use (`argv`, else the cluster's), refused if invalid."""
        try:
            cluster = self.config.cluster(cluster_name)
            launch_argv = list(argv if argv is not None else cluster.launch_argv)
            parse_launch_command(launch_argv)
        except ConfigError as exc:
            raise Refused(str(exc)) from None
        except LaunchCommandError as exc:
            raise Refused(f"cluster {cluster_name}: launch command: {exc}") from None
        return cluster, launch_argv

    async def _runner(self, cluster: ClusterConfig) -> RunnerState:
        """The runner to ask, refused while the cluster has an active run (settled first: its follower may have
        died) or when none of its runners can take the run."""
        active = await self.store.call(Store.active_run, cluster.name)
        if active is not None and (await self.settle(active)).status in ACTIVE:
            raise Refused(f"cluster {cluster.name} already has an active run: {active.id}")
        try:
            return await pick_runner(self.config, cluster)
        except DispatchError as exc:
            raise Refused(str(exc)) from None

    async def _request(
        self,
        cluster: ClusterConfig,
        launch_argv: list[str],
        requested_by: str,
        *,
        profile: str,
        image: str,
        deployment_error: pb.FirstError | None,
        fixed: pb.FixedRequest | None,
        minimize: pb.Minimize | None,
    ) -> pb.StartRunRequest:
        """The new run's StartRun request: `start`'s overrides, else the cluster's, and the cluster's changes."""
        run_id = new_run_id()
        changes = await self.store.call(Store.changes, cluster.name)
        return pb.StartRunRequest(
            run_id=run_id,
            cluster=cluster.name,
            image=image or cluster.image,
            launch_argv=launch_argv,
            request=fixed
            or pb.FixedRequest(
                api=cluster.request.api, body_json=cluster.request.body_json, repeats=cluster.request.repeats
            ),
            profile=profile or cluster.profile,
            requested_by=requested_by,
            changes=[pb.Change(at=c.at, what=c.what, by=c.by) for c in changes],
            deployment_error=deployment_error,
            minimize=minimize,
        )

    async def _reserve(self, request: pb.StartRunRequest, runner: str, minimize: pb.Minimize | None) -> None:
        """Stores the run's row, with what it asks for: the row reserves the cluster (one active run each) while
        the runner is asked. Refused if another run reserved it since `_runner` looked."""
        asked = {
            "argv": list(request.launch_argv),
            "request": request.request.body_json,
            "api": request.request.api,
            "repeats": request.request.repeats,
            "profile": request.profile,
            **({"minimize_of": minimize.original_run_id} if minimize is not None else {}),
        }
        try:
            await self.store.call(
                Store.create_run,
                request.run_id,
                request.cluster,
                runner=runner,
                requested_by=request.requested_by,
                image=request.image,
                request_json=json.dumps(asked),
            )
        except ActiveRunExists as exc:
            raise Refused(f"cluster {request.cluster} already has an active run: {exc.run_id}") from None

    async def _ask(self, request: pb.StartRunRequest, runner: str, via: str, place: str) -> StartedRun:
        """Sends the reserved run to its runner. A refusal or failure discards the row (a refusal is audited);
        once accepted, any failure closes the stream `accept` returned, which no one will follow."""
        try:
            first, live = await accept(self.config, runner, request)
        except BaseException as exc:
            await self.store.call(Store.discard_run, request.run_id)
            if isinstance(exc, RunRefused):
                why = str(exc)
                await self.store.call(
                    Store.audit, request.requested_by, "start refused", request.cluster, why, via, place
                )
                raise Refused(why) from None
            raise
        try:  # the store gives the event back redacted: what the caller shows is what it keeps
            stored = await self.store.call(Store.add_event, first)
            first = stored if stored is not None else first
            what = f"run {request.run_id} on {runner}"
            await self.store.call(Store.audit, request.requested_by, "start", request.cluster, what, via, place)
        except BaseException:
            await live.close()
            raise
        return StartedRun(request.run_id, runner, request, first, live)

    async def follow(
        self, started: StartedRun, on_event: EventCallback, on_reconnect: ReconnectCallback | None = None
    ) -> pb.RunFinished:
        """Streams a run `start` returned to its end, from its first event, on from the stream that started it."""
        try:
            await on_event(started.first)
        except BaseException:
            await started.abandon()
            raise
        return await self._followed(started.run_id, started.runner, on_event, on_reconnect, started.live)

    async def resume(
        self, run_id: str, on_event: EventCallback, on_reconnect: ReconnectCallback | None = None
    ) -> pb.RunFinished:
        """Follows a run this bot stored earlier, from the last event it stored."""
        run = await self.store.call(Store.get_run, run_id)
        return await self._followed(run.id, run.runner, on_event, on_reconnect)

    async def _followed(
        self,
        run_id: str,
        runner: str,
        on_event: EventCallback,
        on_reconnect: ReconnectCallback | None,
        live: LiveStream | None = None,
    ) -> pb.RunFinished:
        self.following.add(run_id)
        try:
            return await follow_run(self.config, self.store, run_id, runner, on_event, on_reconnect, live)
        finally:
            self.following.discard(run_id)

    async def settle(self, run: Run) -> Run:
        """A stored active run as its runner knows it now. The process that followed it may have died (a CLI
        killed mid-run): when its runner no longer runs it, its journal is replayed into the store up to its
        run_finished, so the cluster is free again. A run still running, one this process follows, one not yet
        accepted (no event stored: a start may be in flight) or an unreachable runner: the row as stored."""
        if run.status not in ACTIVE or run.id in self.following:
            return run
        if await self.store.call(Store.last_seq, run.id) == 0:
            return run
        try:
            async with open_channel(run.runner, self.config.tls) as channel:
                description = await pb_grpc.RunnerStub(channel).Describe(
                    pb.DescribeRequest(), timeout=self.config.connect_timeout_s
                )
        except grpc.aio.AioRpcError:
            return run
        if run.id in description.active_run_ids:
            return run

        async def stored_only(_: pb.RunEvent) -> None:
            return None

        try:  # a finished run's WatchRun replays what the store lacks and ends with its run_finished
            async with asyncio.timeout(self.config.connect_timeout_s + 30):
                await self._followed(run.id, run.runner, stored_only, None)
        except (TimeoutError, RunLost, RunRefused):
            pass
        return await self.store.call(Store.get_run, run.id)

    async def cancel(
        self, run_id: str, requested_by: str, via: str = "cli", place: str = "", by: str = ""
    ) -> Cancelled:
        """`by`: how the thread names who cancelled (Slack: a mention); `requested_by` by default."""
        run = await self.store.call(Store.get_run, run_id)
        if run.status not in ACTIVE:
            return Cancelled(run.id, ended=run.status)
        async with open_channel(run.runner, self.config.tls) as channel:
            try:
                answer = await pb_grpc.RunnerStub(channel).CancelRun(
                    pb.CancelRunRequest(
                        run_id=run.id, requested_by=requested_by, reason=f"cancelled by {by or requested_by}"
                    ),
                    timeout=self.config.connect_timeout_s + 30,
                )
            except grpc.aio.AioRpcError as exc:
                raise Refused(f"cannot cancel run {run.id}: {rpc_error_text(exc)}") from None
        await self.store.call(Store.audit, requested_by, "cancel", run.id, answer.message, via, place)
        return Cancelled(run.id, answer.message)

    async def note(self, cluster_name: str, what: str, by: str, via: str = "cli", place: str = "") -> Change:
        """Appends to a cluster's change log; the next run's freeze records it."""
        try:
            cluster = self.config.cluster(cluster_name)
        except ConfigError as exc:
            raise Refused(str(exc)) from None
        text = " ".join(what.split())
        if not text:
            raise Refused("a note needs text: what changed")
        if len(text) > MAX_NOTE_CHARS:
            raise Refused(f"a note is at most {MAX_NOTE_CHARS} characters (got {len(text)})")
        change = await self.store.call(Store.add_change, cluster.name, text, by, via)
        await self.store.call(Store.audit, by, "note", cluster.name, text, via, place)
        return change

    async def runners(self, cluster_name: str | None = None) -> list[tuple[str, RunnerState]]:
        names = [cluster_name] if cluster_name else sorted(self.config.clusters)
        result: list[tuple[str, RunnerState]] = []
        for name in names:
            try:
                cluster = self.config.cluster(name)
            except ConfigError as exc:
                raise Refused(str(exc)) from None
            result.extend((name, state) for state in await survey(self.config, cluster))
        return result
