"""Stopping the daemons the tests start (dockerd, munged, slurmctld, slurmd): politely, then for sure."""

from __future__ import annotations

import subprocess
from typing import Any


def terminate(process: subprocess.Popen[Any], timeout_s: float) -> None:
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
