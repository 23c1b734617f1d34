"""The guard of a `k3repro demo` (demo/run.py): what a killed demo leaves, removed once it is gone."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import sys
from pathlib import Path


def guard(workdir: str) -> None:
    """Waits until the demo's end closes standard input, then kills the engines of every run in the demo's store
    (each engine process carries its run's id) and removes the demo's folder (its store, certificates, keys)."""
    sys.stdin.buffer.read()
    folder = Path(workdir)
    store = folder / "k3repro.db"
    run_ids: set[str] = set()
    if store.exists():
        with (
            contextlib.suppress(sqlite3.Error),
            contextlib.closing(sqlite3.connect(f"{store.as_uri()}?mode=ro", uri=True)) as db,
        ):
            run_ids = {row[0] for row in db.execute("SELECT id FROM runs")}
    if run_ids:
        from runner.engines.process import kill_leftovers

        kill_leftovers(run_ids)
    shutil.rmtree(folder, ignore_errors=True)
