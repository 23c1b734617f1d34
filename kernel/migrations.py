"""Numbered schema migrations for the SQLite files k3repro keeps (the bot's store, the runner's journal), one
style for both: a file's schema is the list of migrations that made it, append only, each applied once, in
order, in a transaction with its record in the file's _migrations table (its number is its position in the
list). A migration is history: it names what the schema was then, never a constant of today's code."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TypeVar

from kernel.clock import WALL

T = TypeVar("T")

# The record, as the bot's store has always made it (sqlite_utils' create of {"id": int, "name": str,
# "applied_at": str}, pk="id"): a file that has it already keeps it as it is.
_RECORD = "CREATE TABLE IF NOT EXISTS [_migrations] ([id] INTEGER PRIMARY KEY, [name] TEXT, [applied_at] TEXT)"


def migrate(conn: sqlite3.Connection, migrations: Sequence[tuple[str, Callable[[T], None]]], target: T) -> list[int]:
    """Applies the migrations `conn`'s file has not recorded, each given `target` (the handle its function
    takes: the connection, or a library's wrapper of it), and returns the numbers applied now."""
    conn.execute(_RECORD)
    applied = {row[0] for row in conn.execute("SELECT id FROM _migrations")}
    done = []
    for number, (name, apply) in enumerate(migrations, start=1):
        if number in applied:
            continue
        with conn:
            if not conn.in_transaction:  # an autocommit connection: one transaction all the same
                conn.execute("BEGIN")
            apply(target)
            conn.execute(
                "INSERT INTO _migrations (id, name, applied_at) VALUES (?, ?, ?)",
                (number, name, WALL.stamp()),
            )
        done.append(number)
    return done
