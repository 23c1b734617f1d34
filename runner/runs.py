"""Runs on this runner: starting them, following them (replay + live), cancelling them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from kernel import images
from kernel.baseline import load_baseline
from kernel.toml_reader import ConfigError
from kernel.vllm_cli import LaunchCommandError, ServeCommand, ladder_step_ids, parse_launch_command
from protos import runner_pb2 as pb
from protos.vocab import API_PATHS
from runner.config import RunnerConfig
from runner.engines import EngineBackend
from runner.events import EventLog, JournalWriteError, heartbeat
from runner.journal import Journal, request_digest
from runner.pipeline import execute
from runner.stages.context import RunContext
from runner.stages.launcher import release

log = logging.getLogger(__name__)
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# An image reference as Docker's distribution/reference grammar has it: [registry[:port]/]path[:tag][@digest],
# path components lower-case; checked before the allowlist, whose `*` would otherwise match anything.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])"
)
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
MAX_ARGV_TOKENS = 512
MAX_BODY_BYTES = 256 * 1024


class RunRejected(Exception):
    """A StartRun this runner will not execute; `code` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ActiveRun:
    context: RunContext
    task: asyncio.Task[None] | None = None
    cancel_reason: str = field(default="cancelled")


class RunHub:
    def __init__(self, config: RunnerConfig, journal: Journal, backend: EngineBackend) -> None:
        self.config = config
        self.journal = journal
        self.backend = backend
        self.events = EventLog(journal)
        self.active: dict[str, ActiveRun] = {}
        self.accepting = True
        self.once = False  # `serve --once`: one run, then the daemon exits (an isolated runner in a batch job)
        self.served = asyncio.Event()  # set when a run has ended

    def validate(self, request: pb.StartRunRequest) -> ServeCommand:
        """Everything that makes a request unacceptable, as one clear message."""
        if not self.accepting:
            raise RunRejected("UNAVAILABLE", "runner is shutting down")
        if not RUN_ID.fullmatch(request.run_id):
            raise RunRejected("INVALID_ARGUMENT", "run_id must be 1-64 letters, digits, '.', '_' or '-'")
        if len(request.launch_argv) > MAX_ARGV_TOKENS:
            raise RunRejected("INVALID_ARGUMENT", f"launch command has over {MAX_ARGV_TOKENS} arguments")
        if len(request.request.body_json.encode()) > MAX_BODY_BYTES:
            raise RunRejected("INVALID_ARGUMENT", f"request body is over {MAX_BODY_BYTES // 1024} KiB")
        if request.cluster != self.config.cluster:
            raise RunRejected(
                "INVALID_ARGUMENT",
                f"this runner serves cluster {self.config.cluster!r}, not {request.cluster!r}",
            )
        image = IMAGE_REFERENCE.fullmatch(request.image) if len(request.image) <= 512 else None
        if image is None or len(image.group("name")) > 255:  # shown without what could format a Slack message
            shown = re.sub(r"[^A-Za-z0-9._:/@\[\]-]", "?", request.image[:200])
            marks = "; ? marks a character no reference has" if "?" in shown else ""
            raise RunRejected(
                "INVALID_ARGUMENT",
                f"image {shown!r} is not an image reference ([registry[:port]/]path[:tag][@digest]{marks})",
            )
        if not any(fnmatchcase(request.image, pattern) for pattern in self.config.allowed_images):
            allowed = ", ".join(self.config.allowed_images)
            raise RunRejected("PERMISSION_DENIED", f"image {request.image!r} is not allowlisted here ({allowed})")
        if request.rerun.image_digest and images.digest(request.image) != request.rerun.image_digest:
            raise RunRejected(
                "FAILED_PRECONDITION",
                f"rerun of {request.rerun.original_run_id}: image {request.image!r} is not the bundle's digest "
                f"{request.rerun.image_digest} (a tag can move; a rerun runs exactly what failed)",
            )
        if request.HasField("minimize") and (
            request.minimize.step not in ladder_step_ids()
            or request.minimize.phase == pb.PHASE_UNSPECIFIED
            or not request.minimize.signature
        ):
            raise RunRejected("INVALID_ARGUMENT", "minimize needs the trigger step, its phase and its signature")
        if request.profile:  # checked now, not at the baseline stage: a typo must not cost a freeze and a run
            try:
                load_baseline(request.profile, self.config.baseline_dirs)
            except ConfigError as exc:
                raise RunRejected("INVALID_ARGUMENT", str(exc)) from None
        if refusal := self.backend.refusal(list(request.launch_argv)):
            raise RunRejected("PERMISSION_DENIED", refusal)
        if self.once and (self.active or self.served.is_set()) and self.journal.request(request.run_id) is None:
            raise RunRejected("RESOURCE_EXHAUSTED", f"runner {self.config.name} serves one run only (--once)")
        if request.request.api and request.request.api not in API_PATHS:
            raise RunRejected("INVALID_ARGUMENT", f"request api must be one of {', '.join(API_PATHS)}")
        if request.request.body_json:
            try:
                body = json.loads(request.request.body_json)
            except json.JSONDecodeError as exc:
                raise RunRejected("INVALID_ARGUMENT", f"request body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise RunRejected("INVALID_ARGUMENT", "request body must be a JSON object")
        try:
            return parse_launch_command(list(request.launch_argv))
        except LaunchCommandError as exc:
            raise RunRejected("INVALID_ARGUMENT", f"launch command: {exc}") from None

    def start(self, request: pb.StartRunRequest) -> None:
        """Starts a run, or does nothing when this exact request already started (a retried StartRun)."""
        command = self.validate(request)
        known = self.journal.request_sha256(request.run_id)
        if known is not None:
            if known != request_digest(request):
                raise RunRejected("ALREADY_EXISTS", f"run {request.run_id} exists with a different request")
            return
        if len(self.active) >= self.config.max_concurrent_runs:
            busy = ", ".join(self.active)
            raise RunRejected("RESOURCE_EXHAUSTED", f"runner {self.config.name} is busy with run {busy}")
        self.journal.add_run(request)
        run_id = request.run_id

        async def emit(**payload: object) -> pb.RunEvent:
            return await self.events.emit(run_id, **payload)

        context = RunContext(run_id, request, command, self.config, self.backend, emit)
        active = ActiveRun(context)
        self.active[run_id] = active
        active.task = asyncio.create_task(self._execute(active), name=f"run-{run_id}")
        log.info("run %s started for %s on %s", run_id, request.requested_by or "?", request.cluster)

    async def _execute(self, active: ActiveRun) -> None:
        try:
            try:
                finished = await execute(active.context, lambda: active.cancel_reason)
            except JournalWriteError as exc:  # raised where the pipeline reports a cancel: stop, say why
                with contextlib.suppress(JournalWriteError):
                    await asyncio.shield(release(active.context))
                finished = pb.RunFinished(status=pb.RUN_STATUS_ERROR, reasons=[str(exc)], summary=str(exc))
                finished.launches = active.context.session.launches
            finally:
                self.active.pop(active.context.run_id, None)  # free before a bot can read that the run ended
            await active.context.emit(run_finished=finished)
        finally:
            self.served.set()

    async def watch(self, run_id: str, after_seq: int) -> AsyncIterator[pb.RunEvent]:
        """Replays journaled events after `after_seq`, then follows live ones; heartbeats when quiet. A
        finished run always ends its stream with its run_finished, even when the watcher has it already: an
        empty stream would read as a lost connection."""
        if self.journal.request(run_id) is None:
            raise RunRejected("NOT_FOUND", f"no run {run_id} on runner {self.config.name}")
        last = after_seq
        while True:
            # Reading under the lock means an event journaled after the read notifies us after we wait.
            async with self.events.changed:
                batch = list(self.journal.events(run_id, last))
                final = None if batch else self._final(run_id)
                if not batch and final is None:
                    try:
                        await asyncio.wait_for(self.events.changed.wait(), self.config.heartbeat_s)
                        continue
                    except TimeoutError:
                        pass
            if final is not None:
                yield final
                return
            if not batch:
                active = self.active.get(run_id)
                yield heartbeat(run_id, last, active.context.stage if active else pb.STAGE_UNSPECIFIED)
            for event in batch:
                last = event.seq
                yield event
                if event.WhichOneof("payload") == "run_finished":
                    return

    def _final(self, run_id: str) -> pb.RunEvent | None:
        """The run's run_finished event once it has one (journaled, or kept in memory when the journal
        could not write it)."""
        if self.journal.is_finished(run_id):
            return self.journal.last_event(run_id)
        return self.events.unjournaled.get(run_id)

    async def cancel(self, run_id: str, reason: str) -> bool:
        active = self.active.get(run_id)
        if active is None or active.task is None:
            if self.journal.request(run_id) is None:
                raise RunRejected("NOT_FOUND", f"no run {run_id} on runner {self.config.name}")
            return False
        active.cancel_reason = reason
        active.task.cancel()
        await asyncio.wait([active.task])
        return True

    async def shutdown(self, reason: str) -> None:
        """Stops accepting runs and cancels the active ones, each reported as cancelled."""
        self.accepting = False
        await asyncio.gather(*(self.cancel(run_id, reason) for run_id in list(self.active)))

    async def recover(self) -> list[str]:
        """Closes runs a previous process of this runner left unfinished, and stops what they started."""
        orphans = self.journal.unfinished_runs()
        if orphans:
            self.backend.remove_leftovers(set(orphans))
        for run_id in orphans:
            reason = "the runner restarted while this run was active; its engine was stopped"
            await self.events.emit(
                run_id,
                run_finished=pb.RunFinished(status=pb.RUN_STATUS_ERROR, reasons=[reason], summary=reason),
            )
        return orphans
