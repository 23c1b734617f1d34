"""The engine core's shared-memory broadcast, read by a worker that waits for its next message (none comes)."""

from __future__ import annotations

import time

SPIN_S = 0.1  # vLLM's reader spins and polls until a block is written


class MessageQueue:
    def acquire_read(self) -> None:
        while True:  # the writer (the engine core) waits on the hung rank: no block is ever written
            time.sleep(SPIN_S)

    def dequeue(self) -> None:
        self.acquire_read()
