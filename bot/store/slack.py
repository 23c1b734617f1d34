"""The Slack front-end's tables: its outbox (bot/slack/outbox.py decides what to send when; these are the rows),
each run's thread, and the request ids already handled."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from bot.store.base import Tables, now
from bot.store.rows import OutboxRow, OutboxState, Posted, Thread
from kernel.clock import WALL

_SET_REF_SQL = {  # a run's messages that later writes refer to, by their ts
    "parent_ts": "UPDATE slack_threads SET parent_ts = ? WHERE run_id = ?",
    "checklist_ts": "UPDATE slack_threads SET checklist_ts = ? WHERE run_id = ?",
}
THREAD_REFS = tuple(_SET_REF_SQL)
_PUT_SQL = (
    "INSERT INTO slack_outbox (key, lane, run_id, method, payload_json, state, version, attempts, not_before,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, 1, 0, 0, ?) ON CONFLICT(key) "
)
_PUT_CONFLICT = {
    True: "DO UPDATE SET payload_json = excluded.payload_json, state = excluded.state, version = version + 1,"
    " attempts = 0",
    False: "DO NOTHING",
}


class SlackTables(Tables):
    # --- requests ---

    def claim_request(self, request_id: str) -> bool:
        """True the first time a Slack request id is seen: a retried delivery never does anything twice. Slack
        stops retrying within minutes, so ids older than a day are forgotten."""
        forget = (WALL.utc() - timedelta(days=1)).isoformat(timespec="milliseconds")
        with self.db.conn:
            self.db.execute("DELETE FROM slack_requests WHERE at < ?", [forget])
            cursor = self.db.execute(
                "INSERT INTO slack_requests (id, at) VALUES (?, ?) ON CONFLICT(id) DO NOTHING", [request_id, now()]
            )
        return cursor.rowcount == 1

    # --- threads ---

    def create_thread(self, run_id: str, channel: str, team_domain: str) -> None:
        with self.db.conn:
            self.db.table("slack_threads").insert(
                {"run_id": run_id, "channel": channel, "team_domain": team_domain, "created_at": now()}
            )

    def thread(self, run_id: str) -> Thread | None:
        rows = list(self.db.table("slack_threads").rows_where("run_id = ?", [run_id]))
        return Thread(**rows[0]) if rows else None

    # --- outbox ---

    def put_write(self, key: str, lane: str, run_id: str, method: str, payload_json: str, *, coalesce: bool) -> None:
        """A new write; one whose key is stored already is left as it is, unless it `coalesce`s (a message's
        newer state: the row takes it as a new version, pending again)."""
        with self.db.conn:
            self.db.execute(
                _PUT_SQL + _PUT_CONFLICT[coalesce],
                [key, lane, run_id, method, payload_json, OutboxState.PENDING, now()],
            )

    def pending_lanes(self) -> list[str]:
        sql = "SELECT DISTINCT lane FROM slack_outbox WHERE state = ?"
        return [row[0] for row in self.db.execute(sql, [OutboxState.PENDING])]

    def pending_writes(self, lane: str, *, least_recently_sent: bool) -> list[OutboxRow]:
        """A lane's pending writes (at most 100), in order; `least_recently_sent`: the row whose state was sent
        longest ago (or never) first."""
        order = "sent_at IS NOT NULL, sent_at, id" if least_recently_sent else "id"
        rows = self.db.table("slack_outbox").rows_where(
            "state = ? AND lane = ?", [OutboxState.PENDING, lane], order_by=order, limit=100
        )
        return [OutboxRow(**row) for row in rows]

    def is_pending(self, key: str) -> bool:
        sql = "SELECT COUNT(*) FROM slack_outbox WHERE key = ? AND state = ?"
        return bool(self.db.execute(sql, [key, OutboxState.PENDING]).fetchone()[0])

    def will_create(self, run_id: str, ref: str) -> bool:
        """Whether a write of the run that `creates` the message `ref` is pending or sent (not given up)."""
        sql = (
            "SELECT COUNT(*) FROM slack_outbox WHERE run_id = ? AND state != ?"
            " AND json_extract(payload_json, '$.creates') = ?"
        )
        return bool(self.db.execute(sql, [run_id, OutboxState.FAILED, ref]).fetchone()[0])

    def count_attempt(self, write_id: int, mark: str) -> None:
        """Counted before the call, with `mark` as its error until the answer says otherwise (a crash leaves it)."""
        with self.db.conn:
            self.db.execute("UPDATE slack_outbox SET attempts = attempts + 1, error = ? WHERE id = ?", [mark, write_id])

    def delay_write(self, write_id: int, not_before: float, error: str) -> None:
        with self.db.conn:
            self.db.execute(
                "UPDATE slack_outbox SET not_before = ?, error = ? WHERE id = ?", [not_before, error, write_id]
            )

    def keep_progress(self, write_id: int, extra: dict[str, Any]) -> None:
        """The write's `extra` (an upload's steps done so far), in its payload."""
        with self.db.conn:
            self.db.execute(
                "UPDATE slack_outbox SET payload_json = json_set(payload_json, '$.extra', json(?)) WHERE id = ?",
                [json.dumps(extra), write_id],
            )

    def replace_write(self, write_id: int, method: str, payload_json: str, error: str) -> None:
        """Another write in the same row (same key, same place in its lane), with its own attempts."""
        with self.db.conn:
            self.db.execute(
                "UPDATE slack_outbox SET method = ?, payload_json = ?, attempts = 0, not_before = 0, error = ?"
                " WHERE id = ?",
                [method, payload_json, error, write_id],
            )

    def finish_write(
        self, write_id: int, version: int, state: OutboxState, error: str, posted: Posted | None = None
    ) -> None:
        """Completes the version that was sent; a newer coalesced version stays pending and goes out next.
        A file's content is dropped once it is in Slack: the row's key is all that is still needed. `posted`:
        the run message it created, kept in its thread (the card's place is also the run's: runs.channel,
        runs.thread_ts)."""
        with self.db.conn:
            self.db.execute(
                "UPDATE slack_outbox SET state = ?, error = ?, sent_at = ?, not_before = 0,"
                " payload_json = json_remove(payload_json, '$.extra.content') WHERE id = ? AND version = ?",
                [state, error, now(), write_id, version],
            )
            if posted is None:
                return
            self.db.execute(_SET_REF_SQL[posted.ref], [posted.ts, posted.run_id])
            if posted.ref == "parent_ts":
                self.db.execute(
                    "UPDATE runs SET channel = ?, thread_ts = ? WHERE id = ?",
                    [posted.channel, posted.ts, posted.run_id],
                )

    def pending_count(self, lane: str = "") -> int:
        """Writes not sent yet, in one lane or in all."""
        sql = "SELECT COUNT(*) FROM slack_outbox WHERE state = ? AND (? = '' OR lane = ?)"
        return int(self.db.execute(sql, [OutboxState.PENDING, lane, lane]).fetchone()[0])
