"""Run ids: sortable by time, short enough to type in a chat command, unique enough per cluster."""

from __future__ import annotations

import secrets

from kernel.clock import WALL


def new_run_id() -> str:
    """32 random bits a second: 100 starts in one second collide with a chance of about 1 in a million (16 bits
    gave 7 %, and a start under load failed on the store's unique id)."""
    return f"{WALL.utc():%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"
