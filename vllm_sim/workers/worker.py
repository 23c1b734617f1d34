"""A simulated rank's busy loop (`python -m vllm_sim.workers.worker RANK [COLLECTIVE]`): blocked in COLLECTIVE,
or, without one, in the shared-memory broadcast, until the engine is stopped."""

from __future__ import annotations

import sys

from vllm_sim.workers.distributed.device_communicators.pynccl import PyNcclCommunicator
from vllm_sim.workers.distributed.device_communicators.shm_broadcast import MessageQueue


def worker_busy_loop(rank: int, collective: str) -> None:
    if collective:
        getattr(PyNcclCommunicator(rank), collective)()
    MessageQueue().dequeue()


if __name__ == "__main__":
    worker_busy_loop(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "")
