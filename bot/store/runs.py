"""Runs, their events (exactly once per (run_id, seq)) and isolated reruns' links to their originals."""

from __future__ import annotations

import sqlite3
from dataclasses import asdict
from typing import Any

from google.protobuf import json_format

from bot.store.base import ActiveRunExists, RunNotFound, Tables, now, redacted
from bot.store.rows import ACTIVE, FINAL, Rerun, Run, RunState
from kernel.clock import WALL
from kernel.redact import redactor
from kernel.retention import DAY_S, CappedLog, LogBudget, Retention
from protos import runner_pb2 as pb
from protos.vocab import Decision

_ACTIVE_SQL = ", ".join(f"'{status}'" for status in ACTIVE)
_FINAL_SQL = ", ".join(f"'{status}'" for status in FINAL)
# Runs to forget (:cutoff): finished before it, with no event received since (an imported run counts from its
# import), and their isolated reruns with them; an original goes only once all its reruns may go too.
_OLD = (
    f"status IN ({_FINAL_SQL}) AND finished_at < :cutoff"  # noqa: S608
    " AND NOT EXISTS (SELECT 1 FROM run_events e WHERE e.run_id = r.id AND e.received_at >= :cutoff)"
)
_PRUNED = (
    f"SELECT id FROM runs r WHERE rerun_of IS NULL AND {_OLD} AND NOT EXISTS"  # noqa: S608
    f" (SELECT 1 FROM runs r2 WHERE r2.rerun_of = r.id AND NOT ({_OLD.replace('r.id', 'r2.id')}))"
)
_PRUNE_SQL = (
    "CREATE TEMP TABLE IF NOT EXISTS pruned (id TEXT PRIMARY KEY)",
    "DELETE FROM pruned",
    f"INSERT INTO pruned SELECT id FROM ({_PRUNED}) UNION SELECT id FROM runs WHERE rerun_of IN ({_PRUNED})",  # noqa: S608
    "DELETE FROM run_events WHERE run_id IN (SELECT id FROM pruned)",
    "DELETE FROM log_budgets WHERE run_id IN (SELECT id FROM pruned)",
    "DELETE FROM slack_outbox WHERE run_id IN (SELECT id FROM pruned)",
    "DELETE FROM slack_threads WHERE run_id IN (SELECT id FROM pruned)",
    "DELETE FROM reruns WHERE run_id IN (SELECT id FROM pruned) OR original_id IN (SELECT id FROM pruned)",
    "DELETE FROM runs WHERE id IN (SELECT id FROM pruned) AND rerun_of IS NOT NULL",
    "DELETE FROM runs WHERE id IN (SELECT id FROM pruned)",
)


class RunTables(CappedLog, Tables):
    _pruned_at = 0.0
    # --- runs ---

    def create_run(
        self,
        run_id: str,
        cluster: str,
        *,
        runner: str = "",
        requested_by: str = "",
        image: str = "",
        request_json: str = "{}",
    ) -> None:
        """A new run, running: its row reserves the cluster (one active run each) while its runner is asked."""
        try:
            with self.db.conn:
                self.db.table("runs").insert(_new_run(run_id, cluster, runner, requested_by, image, request_json))
        except sqlite3.IntegrityError:
            active = self.active_run(cluster)
            if active is None:
                raise
            raise ActiveRunExists(active.id) from None

    def discard_run(self, run_id: str) -> None:
        """A start the runner refused: the run's reservation of its cluster goes, and nothing else was stored."""
        with self.db.conn:
            self.db.execute("DELETE FROM runs WHERE id = ?", [run_id])

    def finish_run(self, run_id: str, status: RunState, summary: str = "", decision: Decision | None = None) -> None:
        """A run has ended (`status` one of rows.FINAL): what it decided, in one line."""
        fields = {"status": status, "summary": summary, "decision": decision, "finished_at": now()}
        with self.db.conn:
            self.db.table("runs").update(run_id, {**redacted(fields), "updated_at": now()})

    def close_if_active(self, run_id: str, why: str) -> None:
        """An active run its follower can no longer see end (its placement was released): cancelled, with why."""
        try:
            run = self.get_run(run_id)
        except RunNotFound:
            return
        if run.status in ACTIVE:
            self.finish_run(run_id, RunState.CANCELLED, why)

    def get_run(self, run_id: str, clusters: tuple[str, ...] | None = None) -> Run:
        """A run by id or by a unique prefix of its id; with `clusters`, only a run of one of them."""
        # a prefix by substr, not LIKE: '%' and '_' in what was typed are characters, never wildcards
        where = "(id = ? OR substr(id, 1, ?) = ?)"
        params: list[Any] = [run_id, len(run_id), run_id]
        if clusters is not None:
            where += f" AND cluster IN ({', '.join('?' * len(clusters))})"
            params += clusters
        rows = list(self.db.table("runs").rows_where(where, params, limit=2))
        exact = [row for row in rows if row["id"] == run_id]
        if exact:
            return Run(**exact[0])
        if len(rows) == 1:
            return Run(**rows[0])
        raise RunNotFound(f"no run {run_id!r}" if not rows else f"run id {run_id!r} is ambiguous")

    def run_ids_of_runner(self, runner: str) -> list[str]:
        return [row["id"] for row in self.db.table("runs").rows_where("runner = ?", [runner], select="id")]

    def active_run(self, cluster: str) -> Run | None:
        """The cluster's active run (an isolated rerun runs elsewhere and does not count)."""
        where = f"cluster = ? AND status IN ({_ACTIVE_SQL}) AND rerun_of IS NULL"
        rows = list(self.db.table("runs").rows_where(where, [cluster]))
        return Run(**rows[0]) if rows else None

    def runs(
        self, limit: int = 20, status: tuple[RunState, ...] = (), clusters: tuple[str, ...] | None = None
    ) -> list[Run]:
        """The latest runs, newest first; with `status`, only those in it; with `clusters`, only theirs."""
        wheres, params = [], [str(s) for s in status]
        if status:
            wheres.append(f"status IN ({', '.join('?' * len(status))})")
        if clusters is not None:
            wheres.append(f"cluster IN ({', '.join('?' * len(clusters))})")
            params += clusters
        where = " AND ".join(wheres) or None
        rows = self.db.table("runs").rows_where(where, params, order_by="created_at DESC", limit=limit)
        return [Run(**row) for row in rows]

    def active_runs(self) -> list[Run]:
        """Every active run, isolated reruns included: what a bot that starts resumes."""
        return self.runs(10_000, ACTIVE)

    def import_run(self, run: Run, events: list[pb.RunEvent]) -> None:
        """A run from a bundle, with its events, all or nothing (one transaction: sqlite-utils commits each
        insert of its own otherwise)."""
        with self.db.atomic():
            self.db.table("runs").insert(redacted(asdict(run)))
            self.db.table("run_events").insert_all(_event_row(redactor().message(event)) for event in events)

    # --- isolated reruns ---

    def create_rerun(
        self,
        run_id: str,
        original: Run,
        *,
        runner: str,
        requested_by: str,
        image: str,
        request_json: str,
        provider: str,
        placement: str,
        handle: str,
        bundle_sha256: str,
    ) -> None:
        """The rerun's run (on its original's cluster, marked a rerun of it) and its link, together."""
        run = _new_run(run_id, original.cluster, runner, requested_by, image, request_json)
        link = {
            "run_id": run_id,
            "original_id": original.id,
            "provider": provider,
            "placement": placement,
            "handle": handle,
            "bundle_sha256": bundle_sha256,
            "created_at": run["created_at"],
        }
        with self.db.atomic():
            self.db.table("runs").insert({**run, "rerun_of": original.id})
            self.db.table("reruns").insert(redacted(link))

    def record_verdict(self, run_id: str, verdict: str, comparison_json: str) -> None:
        with self.db.conn:
            self.db.table("reruns").update(run_id, redacted({"verdict": verdict, "comparison_json": comparison_json}))

    def get_rerun(self, run_id: str) -> Rerun:
        return Rerun(**self.db.table("reruns").get(run_id))

    def minimize_runs_of(self, original_id: str) -> list[Run]:
        """The minimize runs of a run, oldest first (their request names the original)."""
        rows = self.db.table("runs").rows_where(
            "CASE WHEN json_valid(request_json) THEN json_extract(request_json, '$.minimize_of') END = ?",
            [original_id],
            order_by="created_at",
        )
        return [Run(**row) for row in rows]

    def reruns_of(self, original_id: str) -> list[Rerun]:
        rows = self.db.table("reruns").rows_where("original_id = ?", [original_id], order_by="created_at")
        return [Rerun(**row) for row in rows]

    # --- events ---

    def add_event(self, event: pb.RunEvent) -> pb.RunEvent | None:
        """Stores an event once and gives it back redacted, as everything the bot shows of it must be (Slack,
        the terminal); None when (run_id, seq) was already stored (a replayed event). A log chunk counts against
        its run's log caps (CappedLog): it may be kept emptied, its seq still taken; what comes back is whole."""
        event = redactor().message(event)
        try:
            with self.db.conn:
                tail, budget = self._admit(event)
                self.db.table("run_events").insert({**_event_row(event), "tail_bytes": tail})
                if budget is not None:
                    self._settle(event.run_id, budget)
        except sqlite3.IntegrityError:
            return None
        if WALL.monotonic() - self._pruned_at >= DAY_S:
            self.prune()
        return event

    def use_retention(self, retention: Retention) -> int:
        """The caps and retention of a config (`log_head_mib`, `log_tail_mib`, `retention_days`), pruning at once."""
        self.retention = retention
        return self.prune()

    def prune(self) -> int:
        """Forgets the runs that finished more than `retention_days` ago: their events, log budgets, Slack
        outbox rows and threads, rerun links (a run and its isolated reruns go together). Done when the store
        opens and at most daily after. Returns how many runs went."""
        self._pruned_at = WALL.monotonic()
        cutoff = self.retention.cutoff()
        if cutoff is None or not self.db.table("log_budgets").exists():  # (a store held at an older migration)
            return 0
        with self.db.conn:
            for sql in _PRUNE_SQL:
                self.db.execute(sql, {"cutoff": cutoff})
            return int(self.db.execute("SELECT COUNT(*) FROM pruned").fetchone()[0])

    # --- CappedLog's storage ---

    def _load_budget(self, run_id: str) -> LogBudget:
        rows = list(self.db.table("log_budgets").rows_where("run_id = ?", [run_id]))
        if not rows:
            return LogBudget()
        row = rows[0]
        del row["run_id"]
        return LogBudget(**{**row, "head_closed": bool(row["head_closed"])})

    def _save_budget(self, run_id: str, budget: LogBudget) -> None:
        row = {**asdict(budget), "run_id": run_id, "head_closed": int(budget.head_closed)}
        self.db.table("log_budgets").insert(row, replace=True)

    def _oldest_tail(self, run_id: str) -> pb.RunEvent | None:
        sql = "SELECT payload_json FROM run_events WHERE run_id = ? AND tail_bytes > 0 ORDER BY seq LIMIT 1"
        row = self.db.execute(sql, [run_id]).fetchone()
        return None if row is None else json_format.Parse(row[0], pb.RunEvent())

    def _replace(self, event: pb.RunEvent) -> None:
        self.db.execute(
            "UPDATE run_events SET payload_json = ?, tail_bytes = 0 WHERE run_id = ? AND seq = ?",
            [json_format.MessageToJson(event, indent=None), event.run_id, event.seq],
        )

    def _event_at(self, run_id: str, seq: int) -> pb.RunEvent | None:
        sql = "SELECT payload_json FROM run_events WHERE run_id = ? AND seq = ?"
        row = self.db.execute(sql, [run_id, seq]).fetchone()
        return None if row is None else json_format.Parse(row[0], pb.RunEvent())

    def last_seq(self, run_id: str) -> int:
        row = self.db.execute("SELECT MAX(seq) FROM run_events WHERE run_id = ?", [run_id]).fetchone()
        return int(row[0] or 0)

    def events(self, run_id: str) -> list[pb.RunEvent]:
        rows = self.db.table("run_events").rows_where("run_id = ?", [run_id], order_by="seq")
        return [json_format.Parse(row["payload_json"], pb.RunEvent()) for row in rows]


def _new_run(
    run_id: str, cluster: str, runner: str, requested_by: str, image: str, request_json: str
) -> dict[str, Any]:
    stamp = now()
    fields = {
        "id": run_id,
        "cluster": cluster,
        "runner": runner,
        "status": RunState.RUNNING,
        "requested_by": requested_by,
        "image": image,
        "request_json": request_json,
    }
    return {**redacted(fields), "created_at": stamp, "updated_at": stamp}


def _event_row(event: pb.RunEvent) -> dict[str, Any]:
    """A redacted event's row (add_event and import_run redact it first)."""
    return {
        "run_id": event.run_id,
        "seq": event.seq,
        "kind": event.WhichOneof("payload") or "",
        "at": event.at.ToJsonString(),
        "payload_json": json_format.MessageToJson(event, indent=None),
        "received_at": now(),
    }
