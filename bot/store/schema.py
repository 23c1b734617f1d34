"""The store's schema, as the migrations that made it: append only, each applied once, in order, and
recorded in _migrations by its number (its position here), by kernel/migrations.py as the runner's journal's
are. A migration is history: it names what the schema was then, never a constant of today's code."""

from __future__ import annotations

from collections.abc import Callable

import sqlite_utils


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


def _m6_one_running_run_per_cluster(db: sqlite_utils.Database) -> None:
    """The one-active-run index on ACTIVE alone: no run was ever written as 'queued', which migrations 1 and 4
    named. Literal, as every migration: a change of ACTIVE is a migration of its own."""
    db.execute("DROP INDEX runs_one_active_per_cluster")
    db.execute(
        "CREATE UNIQUE INDEX runs_one_active_per_cluster ON runs(cluster) WHERE status = 'running' AND rerun_of IS NULL"
    )


def _m7_log_budgets(db: sqlite_utils.Database) -> None:
    """Per-run caps on log lines kept (runner/journal.py CappedLog): a log chunk's bytes still counted in its
    run's rolling tail (0: in the head, dropped, or not a log chunk), and each run's budget."""
    db.table("run_events").add_column("tail_bytes", int, not_null_default=0)
    db.table("log_budgets").create(
        {
            "run_id": str,
            "head": int,
            "head_closed": int,
            "tail": int,
            "dropped_lines": int,
            "dropped_bytes": int,
            "marker_seq": int,
        },
        pk="run_id",
        defaults={"head": 0, "head_closed": 0, "tail": 0, "dropped_lines": 0, "dropped_bytes": 0, "marker_seq": 0},
    )


# Append only: a migration's position is its number, recorded in _migrations.
MIGRATIONS: tuple[tuple[str, Callable[[sqlite_utils.Database], None]], ...] = (
    ("initial", _m1_initial),
    ("change_log", _m2_change_log),
    ("slack", _m3_slack),
    ("reruns", _m4_reruns),
    ("rerun_handles", _m5_rerun_handles),
    ("one_running_run_per_cluster", _m6_one_running_run_per_cluster),
    ("log_budgets", _m7_log_budgets),
)
