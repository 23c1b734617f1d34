"""The one way the bot writes to Slack: persisted in SQLite, paced, coalesced, retried until it lands.

Every write is a row with an idempotency key. Lanes set the order and the pace: `post:CHANNEL` (messages
and files of one channel, in order, about one per second), `update` (chat.update, Tier 3, one row per
message so the latest state wins), `ephemeral` (Tier 4). A 429 pauses its lane for Retry-After; a 5xx, a
time-out or a lost connection is retried with backoff; other Slack errors are permanent and logged. A
restarted bot picks the pending rows up where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.config import SlackConfig
from bot.slack.metrics import Metrics
from bot.slack.tasks import TaskSet
from bot.store import AsyncStore, Store, now

log = logging.getLogger("k3repro.slack.outbox")

BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
DEPENDENCY_POLL_S = 0.5
UPLOAD = "files.upload"  # files_upload_v2: getUploadURLExternal, the upload, completeUploadExternal
SET_REF_SQL = {  # a run's messages that later writes refer to
    "parent_ts": "UPDATE slack_threads SET parent_ts = ? WHERE run_id = ?",
    "checklist_ts": "UPDATE slack_threads SET checklist_ts = ? WHERE run_id = ?",
}


@dataclass(frozen=True)
class Write:
    """One Slack write. `thread`: reply in the run's thread; `target`/`creates`: which run message it
    updates or creates (a ref in slack_threads)."""

    key: str
    method: str
    args: dict[str, Any]
    run_id: str = ""
    thread: bool = False
    target: str = ""
    creates: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # not sent: e.g. a file's content

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


class Outbox:
    def __init__(self, store: AsyncStore, client: AsyncWebClient, config: SlackConfig, metrics: Metrics) -> None:
        self.store = store
        self.client = client
        self.metrics = metrics
        self.intervals = {"update": config.update_interval_s, "ephemeral": 0.0}
        self.post_interval_s = config.post_interval_s
        self._lanes: dict[str, asyncio.Event] = {}
        self._last_sent: dict[str, float] = {}
        self._paused: dict[str, float] = {}  # lane -> monotonic time a 429's Retry-After ends
        self._tasks = TaskSet()
        self._closing = False

    async def start(self) -> None:
        """Resumes the writes a previous process left pending."""
        for lane in await self.store.call(_pending_lanes):
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
            if not self._closing and bool(await self.store.call(pending_count, lane)):  # a write came meanwhile
                self._kick(lane)

    async def _send_next(self, lane: str, rows: list[dict[str, Any]]) -> float:
        """Sends the first write that is due; returns how long to wait before looking again (0: at once)."""
        pause = self._paused.get(lane, 0.0) - time.monotonic()
        if pause > 0:
            return pause
        ordered = lane.startswith("post:")
        waits: list[float] = []
        for row in rows if not ordered else rows[:1]:
            due = row["not_before"] - time.time()
            if due > 0:
                waits.append(due)
                continue
            write = _write(row)
            try:
                refs = await self.store.call(_refs, write)
            except Permanent as exc:
                await self.store.call(_finish, row, "failed", str(exc))
                self.metrics.inc("k3repro_slack_writes_total", method=write.method, outcome="failed")
                return 0
            if refs is None:
                waits.append(DEPENDENCY_POLL_S)
                continue
            pace = self._last_sent.get(lane, 0.0) + self.intervals.get(lane, self.post_interval_s) - time.monotonic()
            if pace > 0:
                return pace
            try:
                await self._send(row, write, refs)
            finally:  # paced from the answer: the next call reaches Slack a whole interval after this one did
                self._last_sent[lane] = time.monotonic()
            return 0
        return min(waits)

    async def _send(self, row: dict[str, Any], write: Write, refs: dict[str, Any]) -> None:
        outcome = "sent"
        try:
            answer = await self._call(write, refs)
        except SlackApiError as exc:
            status, error = exc.response.status_code, slack_error(exc)
            if status == 429:
                retry_after = float(exc.response.headers.get("Retry-After", exc.response.headers.get("retry-after", 1)))
                await self.store.call(_retry, row, time.time() + retry_after, "ratelimited")
                self._paused[write.lane] = time.monotonic() + retry_after
                outcome = "ratelimited"
            elif status >= 500:
                await self.store.call(_retry, row, time.time() + _backoff(row), f"HTTP {status}")
                outcome = "retried"
            else:
                log.error("Slack refused %s (%s): %s", write.method, write.key, error)
                await self.store.call(_finish, row, "failed", error)
                outcome = "failed"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            await self.store.call(_retry, row, time.time() + _backoff(row), type(exc).__name__)
            outcome = "retried"
        else:
            await self.store.call(_finish, row, "sent", "", write, answer)
            if write.creates:
                self._wake_all()
        self.metrics.inc("k3repro_slack_writes_total", method=write.method, outcome=outcome)

    async def _call(self, write: Write, refs: dict[str, Any]) -> dict[str, Any]:
        args = {**write.args, **refs}
        if write.method == UPLOAD:
            answer = await self.client.files_upload_v2(**args, content=write.extra["content"])
        else:
            answer = await self.client.api_call(write.method, json=args)
        return dict(answer.data) if isinstance(answer.data, dict) else {}


def slack_error(exc: SlackApiError) -> str:
    """Slack's error code, or the HTTP status when the answer was not Slack's JSON (a proxy, a 5xx page)."""
    data = exc.response.data
    return (
        str(data.get("error")) if isinstance(data, dict) and data.get("error") else f"HTTP {exc.response.status_code}"
    )


def _backoff(row: dict[str, Any]) -> float:
    return BACKOFF_S[min(row["attempts"], len(BACKOFF_S) - 1)]


def _write(row: dict[str, Any]) -> Write:
    return Write(**json.loads(row["payload_json"]))


# --- SQL, run on the store's thread ---


PUT_SQL = (
    "INSERT INTO slack_outbox (key, lane, run_id, method, payload_json, state, version, attempts, not_before,"
    " created_at) VALUES (?, ?, ?, ?, ?, 'pending', 1, 0, 0, ?) ON CONFLICT(key) "
)
PUT_CONFLICT = {
    True: "DO UPDATE SET payload_json = excluded.payload_json, state = 'pending', version = version + 1",
    False: "DO NOTHING",
}


def _put(store: Store, write: Write) -> None:
    values = [write.key, write.lane, write.run_id, write.method, json.dumps(asdict(write)), now()]
    with store.db.conn:
        store.db.execute(PUT_SQL + PUT_CONFLICT[write.coalesces], values)


def _pending_lanes(store: Store) -> list[str]:
    return [row[0] for row in store.db.execute("SELECT DISTINCT lane FROM slack_outbox WHERE state = 'pending'")]


def _pending(store: Store, lane: str) -> list[dict[str, Any]]:
    rows = store.db.table("slack_outbox").rows_where("state = 'pending' AND lane = ?", [lane], order_by="id", limit=100)
    return list(rows)


def _refs(store: Store, write: Write) -> dict[str, Any] | None:
    """The ts a write needs (its thread's parent, the message it updates); None while not posted yet."""
    needed = [("thread_ts", "parent_ts")] if write.thread else []
    needed += [("ts", write.target)] if write.target else []
    if not needed:
        return {}
    rows = list(store.db.table("slack_threads").rows_where("run_id = ?", [write.run_id]))
    if not rows:
        raise Permanent(f"run {write.run_id} has no Slack thread")
    refs = {arg: rows[0][ref] for arg, ref in needed}
    for ref in (ref for arg, ref in needed if not refs[arg]):
        creators = store.db.execute(
            "SELECT COUNT(*) FROM slack_outbox WHERE run_id = ? AND state != 'failed'"
            " AND json_extract(payload_json, '$.creates') = ?",
            [write.run_id, ref],
        ).fetchone()[0]
        if not creators:
            raise Permanent(f"the message of run {write.run_id} this write needs ({ref}) could not be posted")
        return None
    return refs


def _retry(store: Store, row: dict[str, Any], not_before: float, error: str) -> None:
    with store.db.conn:
        store.db.execute(
            "UPDATE slack_outbox SET attempts = attempts + 1, not_before = ?, error = ? WHERE id = ?",
            [not_before, error, row["id"]],
        )


def _finish(
    store: Store, row: dict[str, Any], state: str, error: str, write: Write | None = None, answer: Any = None
) -> None:
    """Completes the version that was sent; a newer coalesced version stays pending and goes out next.
    A file's content is dropped once it is in Slack: the row's key is all that is still needed."""
    with store.db.conn:
        store.db.execute(
            "UPDATE slack_outbox SET state = ?, error = ?, sent_at = ?, not_before = 0,"
            " payload_json = json_remove(payload_json, '$.extra.content') WHERE id = ? AND version = ?",
            [state, error, now(), row["id"], row["version"]],
        )
        if write is not None and write.creates in SET_REF_SQL and answer:
            store.db.execute(SET_REF_SQL[write.creates], [answer.get("ts"), write.run_id])


def pending_count(store: Store, lane: str = "") -> int:
    """Writes not sent yet, in one lane or in all."""
    sql = "SELECT COUNT(*) FROM slack_outbox WHERE state = 'pending' AND (? = '' OR lane = ?)"
    return int(store.db.execute(sql, [lane, lane]).fetchone()[0])
