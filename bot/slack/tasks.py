"""Background work the bot owns: every task is referenced until it ends, logged if it fails, cancelled on stop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("k3repro.slack")


class TaskSet:
    """Keeps strong references to tasks (the loop only holds weak ones, RUF006) and stops them together."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, work: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("task %s failed", task.get_name(), exc_info=error)

    def __len__(self) -> int:
        return len(self._tasks)

    async def wait(self) -> None:
        """Until every task spawned so far (and any they spawn) has ended."""
        while self._tasks:
            await asyncio.wait(set(self._tasks))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
