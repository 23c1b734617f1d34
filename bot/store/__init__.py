"""The run store, in one SQLite file: the only place the bot's SQL lives.

Its tables come in groups, one module each, joined into `Store`: runs, their events (exactly once per
(run_id, seq)) and isolated reruns (`runs.py`); the Slack front-end's outbox, threads and handled requests
(`slack.py`); change and audit logs (`log.py`). `schema.py` holds the migrations. What it returns is one
frozen dataclass per table (`rows.py`), never a row dict; the statuses a run goes through are defined there.

All access goes through one thread (`AsyncStore`), so the event loop never blocks on SQLite and there is
a single writer. Every text is redacted on its way in (kernel/redact.py, the runner's own path): what a
runner, a bundle, a config or a person gave cannot rest here in clear, whatever later reads it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from bot.store.base import ActiveRunExists, RunNotFound, StoreUnavailable, now, redacted
from bot.store.log import LogTables
from bot.store.rows import (
    ACTIVE,
    FINAL,
    AuditEntry,
    Change,
    OutboxRow,
    OutboxState,
    Posted,
    Rerun,
    RerunVerdict,
    Run,
    RunState,
    Thread,
)
from bot.store.runs import RunTables
from bot.store.schema import MIGRATIONS
from bot.store.slack import THREAD_REFS, SlackTables
from kernel.migrations import migrate
from kernel.retention import Retention, keep_private

__all__ = [
    "ACTIVE",
    "FINAL",
    "MIGRATIONS",
    "THREAD_REFS",
    "ActiveRunExists",
    "AsyncStore",
    "AuditEntry",
    "Change",
    "OutboxRow",
    "OutboxState",
    "Posted",
    "Rerun",
    "RerunVerdict",
    "Retention",
    "Run",
    "RunNotFound",
    "RunState",
    "Store",
    "StoreUnavailable",
    "Thread",
    "now",
    "redacted",
]

T = TypeVar("T")


class Store(RunTables, SlackTables, LogTables):
    """`retention`: the per-run log caps and how long finished runs are kept (pruned at open, then daily)."""

    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        self.retention = retention or Retention()
        try:
            keep_private(path)  # the file 0600 (its -wal and -shm follow it) in a 0700 folder
            self.db = sqlite_utils.Database(path)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA busy_timeout=5000")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.execute("PRAGMA synchronous=NORMAL")
            migrate(self.db.conn, MIGRATIONS, self.db)
            self.prune()
        except OSError as exc:
            raise StoreUnavailable(f"the run store {path} cannot be used: {exc.strerror}") from None
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"the run store {path} cannot be used: {exc}") from None

    def close(self) -> None:
        self.db.close()


class AsyncStore:
    """The store behind a single thread: `await store.call(Store.method, args...)`."""

    def __init__(self, path: Path, retention: Retention | None = None) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="k3repro-store")
        self._store = self._executor.submit(Store, path, retention).result()

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: method(self._store, *args, **kwargs))

    def close(self) -> None:
        self._executor.submit(self._store.close).result()
        self._executor.shutdown()
