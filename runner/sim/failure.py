"""Writes a failure's blocks the way each vLLM process would, with the pauses between processes."""

from __future__ import annotations

from collections.abc import Sequence

from runner.sim.catalog import Block
from runner.sim.clock import SimClock
from runner.sim.logwriter import LogWriter, Procs


async def write_failure(blocks: Sequence[Block], log: LogWriter, procs: Procs, clock: SimClock) -> None:
    for block in blocks:
        await clock.sleep(block.delay)
        proc = procs.of(block.role, block.rank)
        if block.logged:
            log.log(proc, "ERROR", block.logged_file, block.logged)
        traceback = ["Traceback (most recent call last):", *block.frames, *block.exception]
        if block.header:  # logger.exception(): the traceback is part of the log record
            log.log(proc, "ERROR", block.file, "\n".join([block.header, *traceback]))
        else:  # an uncaught exception, printed by the interpreter or multiprocessing on stderr
            log.plain(proc, [block.title, *traceback] if block.title else traceback)
