"""Run ids: sortable by time, short enough to type in a chat command, unique enough per cluster."""

from __future__ import annotations

import secrets
from datetime import UTC, datetime


def new_run_id() -> str:
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
