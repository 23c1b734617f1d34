"""A collective that never completes: the peer it waits for is not in it (NCCL spins on the device; here, a wait)."""

from __future__ import annotations

import threading


class PyNcclCommunicator:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._peers = threading.Event()  # nothing sets it: the other ranks never join

    def all_reduce(self) -> None:
        self._peers.wait()

    def all_gather(self) -> None:
        self._peers.wait()

    def broadcast(self) -> None:
        self._peers.wait()

    def barrier(self) -> None:
        self._peers.wait()
