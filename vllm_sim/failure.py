"""Writes a failure's blocks the way each vLLM process would, with the pauses between processes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import NoReturn

from vllm_sim.catalog import Block
from vllm_sim.clock import SimClock
from vllm_sim.logwriter import LogWriter, Procs
from vllm_sim.workers import start_ranks


async def write_failure(blocks: Sequence[Block], log: LogWriter, procs: Procs, clock: SimClock) -> None:
    for block in blocks:
        await clock.sleep(block.delay)
        proc = procs.of(block.role, block.rank)
        if block.logged:
            log.log(proc, "ERROR", block.logged_file, block.logged)
        if not block.traceback:  # the exception alone: logged like its header would be, or bare on stderr
            if block.header:
                log.log(proc, "ERROR", block.file, "\n".join(block.exception))
            else:
                log.plain(proc, list(block.exception))
            continue
        traceback = ["Traceback (most recent call last):", *block.frames, *block.exception]
        if block.header:  # logger.exception(): the traceback is part of the log record
            log.log(proc, "ERROR", block.file, "\n".join([block.header, *traceback]))
        else:  # an uncaught exception, printed by the interpreter or multiprocessing on stderr
            log.plain(proc, [block.title, *traceback] if block.title else traceback)


async def hang(blocks: Sequence[Block], log: LogWriter, procs: Procs, waits: str = "", rank: int = 0) -> NoReturn:
    """Stops making progress for good (a SIGTERM ends it): the failing process writes the fault's text, if
    it has one, on stderr the way NCCL and CUDA print their own warnings, and nothing more. With `waits` (a
    fault's collective), the TP ranks become processes whose stacks show `rank` stuck in it (vllm_sim/workers/)."""
    if blocks:
        log.plain(procs.of(blocks[0].role, blocks[0].rank), list(blocks[0].exception))
    workers = start_ranks(len(procs.workers), rank, waits) if waits and procs.workers else []
    try:
        await asyncio.Event().wait()  # nothing sets it
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
    raise AssertionError("a hang never ends by itself")
