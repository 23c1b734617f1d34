"""py-spy dumps of an engine's processes, all at once and inside a time limit.

A process that cannot be dumped (gone, not Python, no ptrace permission, py-spy missing) gives a ProcessDump with
py-spy's own reason, never an exception: a stalled engine is stopped next whatever the dumps say.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from runner.stacks.summary import ProcessDump

OUTPUT_BYTES = 64 << 10  # what is kept of one dump (a dozen processes stay far under a gRPC message)


def py_spy() -> str | None:
    """The py-spy next to the runner's Python (its venv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


async def dump_command(pid: int, argv: Sequence[str], limit_s: float) -> ProcessDump:
    """Runs one dump command (py-spy on the host) for `pid`, within `limit_s` wall seconds."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return ProcessDump(pid, error=f"py-spy could not run: {exc.strerror or exc}")
    try:
        out, err = await asyncio.wait_for(process.communicate(), limit_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return ProcessDump(pid, error=f"py-spy did not finish in {limit_s:.0f} s")
    text = out[:OUTPUT_BYTES].decode("utf-8", "replace")
    if process.returncode != 0 or "\nThread " not in f"\n{text}":
        return ProcessDump(pid, error=_reason(err.decode("utf-8", "replace")) or f"py-spy exited {process.returncode}")
    return ProcessDump(pid, text)


def _reason(stderr: str) -> str:
    """py-spy's own reason, one line: `Error: Permission denied (os error 13)` → "Permission denied (os error 13)"."""
    for line in stderr.splitlines():
        if line.startswith("Error:"):
            return line.removeprefix("Error:").strip()
    return next((line.strip() for line in stderr.splitlines() if line.strip()), "")


async def dump_pids(pids: Sequence[int], limit_s: float) -> list[ProcessDump]:
    """py-spy dumps of the host's processes `pids`, all at once, each within `limit_s` wall seconds."""
    program = py_spy()
    if program is None:
        return [ProcessDump(pid, error="py-spy is not installed on the runner's host") for pid in pids]
    return list(
        await asyncio.gather(*(dump_command(pid, [program, "dump", "--pid", str(pid)], limit_s) for pid in pids))
    )
