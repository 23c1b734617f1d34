"""What every table group of the store shares: its connection, the clock, redaction on the way in, the errors."""

from __future__ import annotations

from typing import Any

import sqlite_utils

from kernel.clock import WALL
from kernel.redact import redactor


class Tables:
    """A group of the store's tables; `Store` (bot/store/__init__.py) opens the one connection they share."""

    db: sqlite_utils.Database


class ActiveRunExists(Exception):
    """The cluster already has an active run."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


class RunNotFound(LookupError):
    pass


class StoreUnavailable(Exception):
    """The store's file cannot be opened or written (a read-only or full disk, not a SQLite file); one line."""


def redacted(row: dict[str, Any]) -> dict[str, Any]:
    """A row with every text redacted; JSON columns by structure (an escaped request body included)."""
    text = redactor()
    return {
        k: (text.json_text(v) if k.endswith("_json") else text.line(v)) if isinstance(v, str) else v
        for k, v in row.items()
    }


def now() -> str:
    return WALL.stamp()
