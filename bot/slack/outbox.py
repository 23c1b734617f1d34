"""The one way the bot writes to Slack: persisted in SQLite, paced, coalesced, retried with a cap, exactly once.

Every write is a row with an idempotency key. Lanes set the order and the pace: `post:CHANNEL` (messages
and files of one channel, in order, about one per second), `update` (chat.update, Tier 3: one row per
message holds its latest state, and the row sent longest ago goes next, so no message starves another),
`ephemeral` (Tier 4). A 429 pauses its lane for Retry-After; a 5xx, a time-out or a lost connection is
retried with backoff. A write that fails MAX_ATTEMPTS times, or that Slack refuses, is replaced in place by
a short text (so the channel's order moves on), and that text is given up after as many attempts.

Exactly once: the attempt is counted in the row before the call. A post whose row says a call may already
have landed (a time-out, a lost connection, a bot killed mid-call) is first looked for in the channel or
thread by the key it carries in its message metadata; an upload keeps its file id and looks the file's shares
up with files.info before completing it again. A restarted bot picks the pending rows up where it stopped.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import SlackConfig
from bot.slack.metrics import Metrics
from bot.slack.tasks import TaskSet
from bot.store import THREAD_REFS, AsyncStore, OutboxRow, OutboxState, Posted, Store
from kernel.clock import WALL, WallClock

log = logging.getLogger("k3repro.slack.outbox")
T = TypeVar("T")

BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
MAX_ATTEMPTS = 8  # calls of one write before it is replaced by its text fallback (and that, before it is dropped)
DEPENDENCY_POLL_S = 0.5
UPLOAD = "files.upload"  # getUploadURLExternal, the upload, completeUploadExternal: each step kept in the row
KEY_FIELD = "k3repro_key"  # in a post's metadata event_payload: how a restarted bot finds what it posted
WRITE_EVENT = "k3repro_write"
FIND_PAGE = 200  # messages a look-up asks for at a time (Slack advises no more than 200) ...
FIND_PAGES = 25  # ... and pages it follows: past 5,000 messages an earlier attempt counts as not posted
IN_FLIGHT, RATELIMITED = "in flight", "ratelimited"  # a row's error while its call is out; after a 429
FALLBACK_TEXT = 500
NO_FALLBACK = {
    "invalid_auth",
    "not_authed",
    "token_revoked",
    "account_inactive",
    "channel_not_found",
    "not_in_channel",
    "is_archived",
    "missing_scope",
}  # a text would be refused the same way


@dataclass(frozen=True)
class Write:
    """One Slack write. `thread`: reply in the run's thread; `target`/`creates`: which run message it
    updates or creates (a ref in slack_threads); `after`: the key of a write that must be in Slack first."""

    key: str
    method: str
    args: dict[str, Any]
    run_id: str = ""
    thread: bool = False
    target: str = ""
    creates: str = ""
    after: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # not sent: a file's content, an upload's progress

    @property
    def lane(self) -> str:
        if self.method == "chat.update":
            return "update"
        if self.method == "chat.postEphemeral":
            return "ephemeral"
        return f"post:{self.args['channel']}"

    @property
    def coalesces(self) -> bool:
        return self.method == "chat.update"


class Permanent(Exception):
    """Slack refused the write for good (or a message it depends on could not be posted)."""


class LookupFailed(Exception):
    """Slack could not say whether an earlier call landed: the next attempt asks again before calling."""


class Outbox:
    def __init__(
        self, store: AsyncStore, client: AsyncWebClient, config: SlackConfig, metrics: Metrics, clock: WallClock = WALL
    ) -> None:
        self.store = store
        self.clock = clock  # lane pauses and pace (monotonic), a row's not_before (epoch: it outlives a restart)
        self.client = client
        self.metrics = metrics
        self.timeout_s = config.timeout_s
        self.intervals = {"update": config.update_interval_s, "ephemeral": 0.0}
        self.post_interval_s = config.post_interval_s
        self._lanes: dict[str, asyncio.Event] = {}
        self._last_sent: dict[str, float] = {}
        self._paused: dict[str, float] = {}  # lane -> monotonic time a 429's Retry-After ends
        self._tasks = TaskSet()
        self._closing = False

    async def start(self) -> None:
        """Resumes the writes a previous process left pending."""
        for lane in await self.store.call(Store.pending_lanes):
            self._kick(lane)

    async def put(self, write: Write) -> None:
        await self.store.call(_put, write)
        self._kick(write.lane)

    async def idle(self) -> None:
        """Until every lane has nothing left to send (tests, shutdown)."""
        await self._tasks.wait()

    async def close(self) -> None:
        self._closing = True
        await self._tasks.close()

    def _kick(self, lane: str) -> None:
        if lane in self._lanes:
            self._lanes[lane].set()
            return
        self._lanes[lane] = asyncio.Event()
        self._tasks.spawn(self._lane(lane), name=f"outbox {lane}")

    def _wake_all(self) -> None:
        for wake in self._lanes.values():
            wake.set()

    async def _lane(self, lane: str) -> None:
        wake = self._lanes[lane]
        try:
            while True:
                wake.clear()
                rows = await self.store.call(_pending, lane)
                if not rows:
                    return
                delay = await self._send_next(lane, rows)
                if delay > 0:
                    try:
                        async with asyncio.timeout(delay):
                            await wake.wait()
                    except TimeoutError:
                        pass
        finally:
            del self._lanes[lane]
            if not self._closing and bool(await self.store.call(Store.pending_count, lane)):  # a write came meanwhile
                self._kick(lane)

    async def _send_next(self, lane: str, rows: list[OutboxRow]) -> float:
        """Sends the first write that is due; returns how long to wait before looking again (0: at once)."""
        pause = self._paused.get(lane, 0.0) - self.clock.monotonic()
        if pause > 0:
            return pause
        ordered = lane.startswith("post:")
        waits: list[float] = []
        for row in rows if not ordered else rows[:1]:
            due = row.not_before - self.clock.now()
            if due > 0:
                waits.append(due)
                continue
            write = _write(row)
            try:
                refs = await self.store.call(_refs, write)
            except Permanent as exc:
                await self.store.call(_finish, row, OutboxState.FAILED, str(exc))
                self.metrics.inc("k3repro_slack_writes_total", method=write.method, outcome="failed")
                return 0
            if refs is None:
                waits.append(DEPENDENCY_POLL_S)
                continue
            pace = (
                self._last_sent.get(lane, 0.0) + self.intervals.get(lane, self.post_interval_s) - self.clock.monotonic()
            )
            if pace > 0:
                return pace
            try:
                await self._send(row, write, refs)
            finally:  # paced from the answer: the next call reaches Slack a whole interval after this one did
                self._last_sent[lane] = self.clock.monotonic()
            return 0
        return min(waits)

    async def _send(self, row: OutboxRow, write: Write, refs: dict[str, Any]) -> None:
        # counted before the call, marked in flight: after a crash, the row says it may have landed
        await self.store.call(Store.count_attempt, row.id, IN_FLIGHT)
        outcome = "sent"
        try:
            answer = await self._call(row, write, {**write.args, **refs})
        except LookupFailed as exc:
            delay = _retry_after(exc.__cause__) or _backoff(row)
            outcome = await self._retry(row, write, delay, f"lookup failed: {exc}", "retried")
            if isinstance(exc.__cause__, SlackApiError) and exc.__cause__.response.status_code == 429:
                self._paused[write.lane] = self.clock.monotonic() + delay
        except SlackApiError as exc:
            status, error = exc.response.status_code, slack_error(exc)
            if status == 429:
                retry_after = _retry_after(exc) or 1.0
                outcome = await self._retry(row, write, retry_after, RATELIMITED, "ratelimited")
                self._paused[write.lane] = self.clock.monotonic() + retry_after
            elif status >= 500:
                outcome = await self._retry(row, write, _backoff(row), f"HTTP {status}", "retried")
            else:
                outcome = await self._give_up(row, write, error)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            outcome = await self._retry(row, write, _backoff(row), type(exc).__name__ or "error", "retried")
        else:
            await self.store.call(_finish, row, OutboxState.SENT, "", write, answer)
            self._wake_all()  # a write may wait for this one (a ref, `after`)
        self.metrics.inc("k3repro_slack_writes_total", method=write.method, outcome=outcome)

    async def _retry(self, row: OutboxRow, write: Write, delay: float, error: str, outcome: str) -> str:
        if row.attempts + 1 >= MAX_ATTEMPTS:
            return await self._give_up(row, write, f"{error} after {MAX_ATTEMPTS} attempts")
        await self.store.call(Store.delay_write, row.id, self.clock.now() + delay, error)
        return outcome

    async def _give_up(self, row: OutboxRow, write: Write, error: str) -> str:
        """The write's short text fallback takes its row (its key and order in the lane kept, attempts of its
        own); else it is dropped."""
        fallback = _fallback(write, error)
        if fallback is None:
            log.error("Slack write %s (%s) given up: %s", write.method, write.key, error)
            await self.store.call(_finish, row, OutboxState.FAILED, error)
            self._wake_all()
            return "failed"
        log.warning("Slack write %s (%s) replaced by a short text: %s", write.method, write.key, error)
        await self.store.call(Store.replace_write, row.id, fallback.method, _payload(fallback), error)
        return "fallback"

    async def _call(self, row: OutboxRow, write: Write, args: dict[str, Any]) -> dict[str, Any]:
        if write.method == UPLOAD:
            return await self._upload(row, write, args)
        if write.method == "chat.postMessage":
            meta = args.get("metadata") or {"event_type": WRITE_EVENT, "event_payload": {}}
            args["metadata"] = {**meta, "event_payload": {**meta["event_payload"], KEY_FIELD: write.key}}
            if _may_have_landed(row) and (found := await _asking(self._find(row, write, args), None)):
                log.info("Slack message %s was already posted (ts %s); not posted again", write.key, found["ts"])
                return found
        answer = await self.client.api_call(write.method, json=args)
        return dict(answer.data) if isinstance(answer.data, dict) else {}

    async def _find(self, row: OutboxRow, write: Write, args: dict[str, Any]) -> dict[str, Any] | None:
        """The message an earlier attempt posted, by the key in its metadata; None when it is not in Slack.

        Slack answers a page at a time: a thread whose humans talked past a page, or a busy channel since the
        attempt, puts it beyond the first, so the look-up follows the cursor."""
        channel = args["channel"]
        if args.get("thread_ts"):
            pages = partial(self.client.conversations_replies, channel=channel, ts=args["thread_ts"])
        else:
            since = f"{datetime.fromisoformat(row.created_at).timestamp() - 60:.6f}" if row.created_at else None
            pages = partial(self.client.conversations_history, channel=channel, oldest=since)
        cursor: str | None = None
        for _ in range(FIND_PAGES):
            answer = await pages(include_all_metadata=True, limit=FIND_PAGE, cursor=cursor)
            for message in answer.get("messages") or []:
                payload = (message.get("metadata") or {}).get("event_payload") or {}
                if payload.get(KEY_FIELD) == write.key:
                    return {"channel": channel, "ts": message["ts"]}
            cursor = (answer.get("response_metadata") or {}).get("next_cursor") or None
            if cursor is None:
                break
        return None

    async def _upload(self, row: OutboxRow, write: Write, args: dict[str, Any]) -> dict[str, Any]:
        """The three steps, each kept in the row once done, so a retry repeats only the step that failed."""
        extra, content = dict(write.extra), file_bytes(write.extra)
        if not extra.get("file_id"):
            got = await self.client.files_getUploadURLExternal(filename=args["filename"], length=len(content))
            extra.update(file_id=got["file_id"], upload_url=got["upload_url"])
            await self.store.call(Store.keep_progress, row.id, extra)
        if not extra.get("uploaded"):
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(extra["upload_url"], data=content) as response,
            ):
                if response.status >= 400:
                    raise aiohttp.ClientResponseError(response.request_info, (), status=response.status)
            extra.update(uploaded=True)
            await self.store.call(Store.keep_progress, row.id, extra)
        if (
            extra.get("completing")
            and _may_have_landed(row)
            and await _asking(self._shared(extra["file_id"], args), False)
        ):
            log.info("Slack file %s was already shared; not completed again", write.key)
            return {"file_id": extra["file_id"]}
        extra.update(completing=True)
        await self.store.call(Store.keep_progress, row.id, extra)
        done = await self.client.files_completeUploadExternal(
            files=[{"id": extra["file_id"], "title": args["title"]}],
            channel_id=args["channel"],
            thread_ts=args.get("thread_ts"),
        )
        return dict(done.data) if isinstance(done.data, dict) else {}

    async def _shared(self, file_id: str, args: dict[str, Any]) -> bool:
        info = await self.client.files_info(file=file_id)
        shares = (info.get("file") or {}).get("shares") or {}
        places = [p for kind in shares.values() for p in kind.get(args["channel"], [])]
        return (
            any(p.get("thread_ts") == args.get("thread_ts") for p in places) if args.get("thread_ts") else bool(places)
        )


def file_content(content: str | bytes) -> dict[str, Any]:
    """An upload's `extra`: text as it is, bytes (a picture) as base64, since the row that keeps them is JSON."""
    if isinstance(content, str):
        return {"content": content}
    return {"content": base64.b64encode(content).decode(), "encoding": "base64"}


def file_bytes(extra: dict[str, Any]) -> bytes:
    """What file_content kept, as the bytes to upload."""
    text = str(extra["content"])
    return base64.b64decode(text) if extra.get("encoding") == "base64" else text.encode()


def slack_error(exc: SlackApiError) -> str:
    """Slack's error code, or the HTTP status when the answer was not Slack's JSON (a proxy, a 5xx page)."""
    data = exc.response.data
    return (
        str(data.get("error")) if isinstance(data, dict) and data.get("error") else f"HTTP {exc.response.status_code}"
    )


async def _asking(lookup: Awaitable[T], refused: T) -> T:
    """The lookup's answer; `refused` (as if not found: the write goes out again) when Slack refuses the lookup
    itself for good, e.g. an app without the history or files:read scope: at least once, never lost."""
    try:
        return await lookup
    except SlackApiError as exc:
        status = exc.response.status_code
        if status != 429 and status < 500:
            log.warning("Slack refused the look-up for an earlier attempt (%s); writing again", slack_error(exc))
            return refused
        raise LookupFailed(slack_error(exc)) from exc
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise LookupFailed(type(exc).__name__) from exc


def _retry_after(exc: BaseException | None) -> float:
    """A 429's Retry-After in seconds; 0 for anything else."""
    if not isinstance(exc, SlackApiError) or exc.response.status_code != 429:
        return 0.0
    return float(exc.response.headers.get("Retry-After", exc.response.headers.get("retry-after", 1)))


def _may_have_landed(row: OutboxRow) -> bool:
    """An earlier call got no answer that says it did nothing: a crash mid-call, a time-out, a lost
    connection, a 5xx. A 429 says Slack did nothing."""
    return bool(row.attempts) and row.error != RATELIMITED


def _backoff(row: OutboxRow) -> float:
    return BACKOFF_S[min(row.attempts, len(BACKOFF_S) - 1)]


def _write(row: OutboxRow) -> Write:
    return Write(**json.loads(row.payload_json))


def _fallback(write: Write, error: str) -> Write | None:
    """A short text in place of a write that cannot get through: a file becomes a note, a message its text."""
    if write.extra.get("fallback_of") or error.split(" ")[0] in NO_FALLBACK:
        return None
    if write.method == UPLOAD:
        text = (
            f"📎 {write.args['title']} (`{write.args['filename']}`) could not be uploaded ({error});"
            f" `k3repro show {write.run_id}` has it"
        )
    elif write.method == "chat.postMessage":
        text = (
            str(write.args.get("text", ""))[:FALLBACK_TEXT]
            + f"\n_(shortened: Slack did not take the full message: {error})_"
        )
    else:
        return None
    args = {"channel": write.args["channel"], "text": text}
    if write.args.get("reply_broadcast"):
        args["reply_broadcast"] = True
    return replace(write, method="chat.postMessage", args=args, extra={"fallback_of": write.method})


# --- run on the store's thread ---


def _put(store: Store, write: Write) -> None:
    store.put_write(write.key, write.lane, write.run_id, write.method, _payload(write), coalesce=write.coalesces)


def _payload(write: Write) -> str:
    """A write as its row keeps it (`_write` reads it back)."""
    return json.dumps(asdict(write))


def _pending(store: Store, lane: str) -> list[OutboxRow]:
    """In order for a post lane; for updates, the message whose state was sent longest ago (or never) first."""
    return store.pending_writes(lane, least_recently_sent=lane == "update")


def _refs(store: Store, write: Write) -> dict[str, Any] | None:
    """The ts a write needs (its thread's parent, the message it updates); None while not posted yet, or while
    the write it comes `after` is still pending."""
    if write.after and store.is_pending(write.after):
        return None
    needed = [("thread_ts", "parent_ts")] if write.thread else []
    needed += [("ts", write.target)] if write.target else []
    if not needed:
        return {}
    thread = store.thread(write.run_id)
    if thread is None:
        raise Permanent(f"run {write.run_id} has no Slack thread")
    refs = {arg: thread.ts(ref) for arg, ref in needed}
    for ref in (ref for arg, ref in needed if not refs[arg]):
        if not store.will_create(write.run_id, ref):
            raise Permanent(f"the message of run {write.run_id} this write needs ({ref}) could not be posted")
        return None
    return refs


def _finish(
    store: Store, row: OutboxRow, state: OutboxState, error: str, write: Write | None = None, answer: Any = None
) -> None:
    """Completes the version that was sent; a message later writes refer to is kept in its run's thread."""
    posted = None
    if write is not None and write.creates in THREAD_REFS and answer:
        posted = Posted(write.run_id, write.creates, write.args["channel"], answer.get("ts"))
    store.finish_write(row.id, row.version, state, error, posted)
