"""The run store: runs, their events (exactly once per (run_id, seq)) and the audit log, in one SQLite file.

All access goes through one thread (`AsyncStore`), so the event loop never blocks on SQLite and there is
a single writer. Every text is redacted on its way in (runner/redact.py, the runner's own path): what a
runner, a bundle, a config or a person gave cannot rest here in clear, whatever later reads it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils
from google.protobuf import json_format

from protos import runner_pb2 as pb
from runner.redact import redactor

ACTIVE = ("queued", "running")  # the statuses the migrations' one-active-run-per-cluster index names
FINAL = ("completed", "cancelled", "error", "lost")
_ACTIVE_SQL = ", ".join(f"'{status}'" for status in ACTIVE)

T = TypeVar("T")


class ActiveRunExists(Exception):
    """The cluster already has a queued or running run."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class RunNotFound(LookupError):
    pass


class StoreUnavailable(Exception):
    """The store's file cannot be opened or written (a read-only or full disk, not a SQLite file); one line."""


def _m1_initial(db: sqlite_utils.Database) -> None:
    db.table("runs").create(
        {
            "id": str,
            "cluster": str,
            "runner": str,
            "status": str,
            "requested_by": str,
            "channel": str,
            "thread_ts": str,
            "image": str,
            "request_json": str,
            "decision": str,
            "summary": str,
            "created_at": str,
            "updated_at": str,
            "finished_at": str,
        },
        pk="id",
        not_null={"cluster", "status", "created_at"},
    )
    db.execute("CREATE UNIQUE INDEX runs_one_active_per_cluster ON runs(cluster) WHERE status IN ('queued', 'running')")
    db.table("run_events").create(
        {"run_id": str, "seq": int, "kind": str, "at": str, "payload_json": str, "received_at": str},
        foreign_keys=[("run_id", "runs", "id")],
        not_null={"run_id", "seq", "kind", "payload_json"},
    )
    db.table("run_events").create_index(["run_id", "seq"], unique=True)
    db.table("audit_log").create(
        {"id": int, "at": str, "actor": str, "action": str, "target": str, "detail": str, "via": str}, pk="id"
    )


def _m2_change_log(db: sqlite_utils.Database) -> None:
    db.table("changes").create(
        {"id": int, "cluster": str, "at": str, "what": str, "by": str, "via": str},
        pk="id",
        not_null={"cluster", "at", "what"},
    )
    db.table("changes").create_index(["cluster", "at"])


def _m3_slack(db: sqlite_utils.Database) -> None:
    """The Slack front-end: its outbox, each run's thread, processed request ids, and where audited actions came from."""
    db.table("slack_outbox").create(
        {
            "id": int,
            "key": str,  # idempotency key: one row per message write; updates of one message share a row
            "lane": str,  # ops of one lane go out in order, paced together
            "run_id": str,
            "method": str,
            "payload_json": str,
            "state": str,  # pending | sent | failed
            "version": int,  # bumped by every coalesced update; a send only completes the version it sent
            "attempts": int,
            "not_before": float,  # unix time: retry-after / backoff
            "error": str,
            "created_at": str,
            "sent_at": str,
        },
        pk="id",
        not_null={"key", "lane", "method", "payload_json", "state"},
        defaults={"state": "pending", "version": 1, "attempts": 0, "not_before": 0.0},
    )
    db.table("slack_outbox").create_index(["key"], unique=True)
    db.table("slack_outbox").create_index(["state", "lane"])
    db.table("slack_threads").create(
        {"run_id": str, "channel": str, "team_domain": str, "parent_ts": str, "checklist_ts": str, "created_at": str},
        pk="run_id",
        not_null={"channel"},
    )
    db.table("slack_requests").create({"id": str, "at": str}, pk="id")
    db.table("audit_log").add_column("place", str)


def _m4_reruns(db: sqlite_utils.Database) -> None:
    """Isolated reruns: a rerun is a run of its own (on another node, so it does not count as the cluster's
    one active run), linked to the original with where it ran and its verdict."""
    db.table("runs").add_column("rerun_of", str)
    db.execute("DROP INDEX runs_one_active_per_cluster")
    db.execute(
        "CREATE UNIQUE INDEX runs_one_active_per_cluster ON runs(cluster) "
        "WHERE status IN ('queued', 'running') AND rerun_of IS NULL"
    )
    db.table("reruns").create(
        {
            "run_id": str,  # the rerun's own run
            "original_id": str,
            "provider": str,  # static | slurm | kubernetes
            "placement": str,  # where it ran: a runner address, a Slurm job, a Kubernetes Job
            "bundle_sha256": str,
            "verdict": str,  # reproduced | not_reproduced | different_failure (empty until the rerun ends)
            "comparison_json": str,
            "created_at": str,
        },
        pk="run_id",
        foreign_keys=[("run_id", "runs", "id"), ("original_id", "runs", "id")],
        not_null={"original_id", "provider"},
    )
    db.table("reruns").create_index(["original_id"])


def _m5_rerun_handles(db: sqlite_utils.Database) -> None:
    """What ends a rerun's placement (a Slurm job id, a Kubernetes Job name), so that a bot restarted while
    the rerun ran can still release it."""
    db.table("reruns").add_column("handle", str)


# Append only: a migration's position is its number, recorded in _migrations.
MIGRATIONS: tuple[tuple[str, Callable[[sqlite_utils.Database], None]], ...] = (
    ("initial", _m1_initial),
    ("change_log", _m2_change_log),
    ("slack", _m3_slack),
    ("reruns", _m4_reruns),
    ("rerun_handles", _m5_rerun_handles),
)


class Store:
    def __init__(self, path: Path) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite_utils.Database(path)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA busy_timeout=5000")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except OSError as exc:
            raise StoreUnavailable(f"the run store {path} cannot be used: {exc.strerror}") from None
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the run store {path} cannot be used: {exc}") from None

    def _migrate(self) -> None:
        migrations = self.db.table("_migrations")
        if not migrations.exists():
            migrations.create({"id": int, "name": str, "applied_at": str}, pk="id")
        applied = {row["id"] for row in self.db.table("_migrations").rows}
        for number, (name, apply) in enumerate(MIGRATIONS, start=1):
            if number in applied:
                continue
            with self.db.conn:
                apply(self.db)
                self.db.table("_migrations").insert({"id": number, "name": name, "applied_at": now()})

    def close(self) -> None:
        self.db.close()

    # --- Slack requests ---

    def claim_request(self, request_id: str) -> bool:
        """True the first time a Slack request id is seen: a retried delivery never does anything twice. Slack
        stops retrying within minutes, so ids older than a day are forgotten."""
        forget = (datetime.now(UTC) - timedelta(days=1)).isoformat(timespec="milliseconds")
        with self.db.conn:
            self.db.execute("DELETE FROM slack_requests WHERE at < ?", [forget])
            cursor = self.db.execute(
                "INSERT INTO slack_requests (id, at) VALUES (?, ?) ON CONFLICT(id) DO NOTHING", [request_id, now()]
            )
        return cursor.rowcount == 1

    # --- runs ---

    def create_run(self, run: dict[str, Any]) -> None:
        stamp = now()
        try:
            with self.db.conn:
                self.db.table("runs").insert({**redacted(run), "created_at": stamp, "updated_at": stamp})
        except sqlite3.IntegrityError:
            active = self.active_run(run["cluster"])
            if active is None:
                raise
            raise ActiveRunExists(active["id"]) from None

    def discard_run(self, run_id: str) -> None:
        """A start the runner refused: the run's reservation of its cluster goes, and nothing else was stored."""
        with self.db.conn:
            self.db.execute("DELETE FROM runs WHERE id = ?", [run_id])

    def update_run(self, run_id: str, **fields: Any) -> None:
        with self.db.conn:
            self.db.table("runs").update(run_id, {**redacted(fields), "updated_at": now()})

    def get_run(self, run_id: str) -> dict[str, Any]:
        """A run by id or by a unique prefix of its id."""
        rows = list(self.db.table("runs").rows_where("id = ? OR id LIKE ?", [run_id, f"{run_id}%"], limit=2))
        exact = [row for row in rows if row["id"] == run_id]
        if exact:
            return exact[0]
        if len(rows) == 1:
            return rows[0]
        raise RunNotFound(f"no run {run_id!r}" if not rows else f"run id {run_id!r} is ambiguous")

    def run_ids_of_runner(self, runner: str) -> list[str]:
        return [row["id"] for row in self.db.table("runs").rows_where("runner = ?", [runner], select="id")]

    def active_run(self, cluster: str) -> dict[str, Any] | None:
        where = f"cluster = ? AND status IN ({_ACTIVE_SQL}) AND rerun_of IS NULL"
        rows = list(self.db.table("runs").rows_where(where, [cluster]))
        return rows[0] if rows else None

    def runs(self, limit: int = 20, status: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        where = f"status IN ({', '.join('?' * len(status))})" if status else None
        return list(self.db.table("runs").rows_where(where, list(status), order_by="created_at DESC", limit=limit))

    # --- isolated reruns ---

    def create_rerun(self, run: dict[str, Any], rerun: dict[str, Any]) -> None:
        """The rerun's run row and its link to the original, together."""
        stamp = now()
        with self.db.atomic():
            self.db.table("runs").insert({**redacted(run), "created_at": stamp, "updated_at": stamp})
            self.db.table("reruns").insert({**redacted(rerun), "created_at": stamp})

    def update_rerun(self, run_id: str, **fields: Any) -> None:
        with self.db.conn:
            self.db.table("reruns").update(run_id, redacted(fields))

    def get_rerun(self, run_id: str) -> dict[str, Any]:
        row: dict[str, Any] = self.db.table("reruns").get(run_id)
        return row

    def reruns_of(self, original_id: str) -> list[dict[str, Any]]:
        return list(self.db.table("reruns").rows_where("original_id = ?", [original_id], order_by="created_at"))

    def import_run(self, run: dict[str, Any], events: list[pb.RunEvent]) -> None:
        """A run from a bundle, with its events, all or nothing (one transaction: sqlite-utils commits each
        insert of its own otherwise)."""
        with self.db.atomic():
            self.db.table("runs").insert(redacted(run))
            self.db.table("run_events").insert_all(_event_row(event) for event in events)

    # --- events ---

    def add_event(self, event: pb.RunEvent) -> bool:
        """Stores an event once; False when (run_id, seq) was already stored (a replayed event)."""
        try:
            with self.db.conn:
                self.db.table("run_events").insert(_event_row(event))
        except sqlite3.IntegrityError:
            return False
        return True

    def last_seq(self, run_id: str) -> int:
        row = self.db.execute("SELECT MAX(seq) FROM run_events WHERE run_id = ?", [run_id]).fetchone()
        return int(row[0] or 0)

    def events(self, run_id: str) -> list[pb.RunEvent]:
        rows = self.db.table("run_events").rows_where("run_id = ?", [run_id], order_by="seq")
        return [json_format.Parse(row["payload_json"], pb.RunEvent()) for row in rows]

    # --- change log ---

    def add_change(self, cluster: str, what: str, by: str, via: str) -> dict[str, Any]:
        row = redacted({"cluster": cluster, "at": now(), "what": what, "by": by, "via": via})
        with self.db.conn:
            self.db.table("changes").insert(row)
        return row

    def changes(self, cluster: str, limit: int = 50) -> list[dict[str, Any]]:
        """The latest `limit` changes of a cluster, oldest first."""
        rows = self.db.table("changes").rows_where("cluster = ?", [cluster], order_by="id DESC", limit=limit)
        return list(reversed(list(rows)))

    # --- audit ---

    def audit(self, actor: str, action: str, target: str, detail: str = "", via: str = "cli", place: str = "") -> None:
        """`place`: where the action was asked for (a Slack channel id; empty for the terminal)."""
        row = redacted({"at": now(), "actor": actor, "action": action, "target": target, "detail": detail, "via": via})
        with self.db.conn:
            self.db.table("audit_log").insert({**row, "place": place})

    def audit_entries(self, limit: int = 50) -> list[dict[str, Any]]:
        return list(self.db.table("audit_log").rows_where(order_by="id DESC", limit=limit))


def redacted(row: dict[str, Any]) -> dict[str, Any]:
    """A row with every text redacted; JSON columns by structure (an escaped request body included)."""
    text = redactor()
    return {
        k: (text.json_text(v) if k.endswith("_json") else text.line(v)) if isinstance(v, str) else v
        for k, v in row.items()
    }


def _event_row(event: pb.RunEvent) -> dict[str, Any]:
    event = redactor().message(event)
    return {
        "run_id": event.run_id,
        "seq": event.seq,
        "kind": event.WhichOneof("payload") or "",
        "at": event.at.ToJsonString(),
        "payload_json": json_format.MessageToJson(event, indent=None),
        "received_at": now(),
    }


class AsyncStore:
    """The store behind a single thread: `await store.call(Store.method, args...)`."""

    def __init__(self, path: Path) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k3repro-store")
        self._store = self._executor.submit(Store, path).result()

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: method(self._store, *args, **kwargs))

    def close(self) -> None:
        self._executor.submit(self._store.close).result()
        self._executor.shutdown()


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
