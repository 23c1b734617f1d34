"""The tensor-parallel ranks of a simulated hang as real processes, so a stack dump of the engine finds them.

Each rank is a Python process titled as vLLM titles its workers (`VLLM::Worker_TP<rank>`), blocked in a function
named and placed as vLLM's is: the hung rank in a collective of distributed/device_communicators/pynccl.py, the
others in distributed/device_communicators/shm_broadcast.py's acquire_read, waiting for the engine core's next
broadcast. Nothing reads these stacks but a dump (py-spy); they are what a real wedged engine shows.
"""

from __future__ import annotations

import os
import subprocess
import sys

TITLE = "VLLM::Worker_TP{rank}"  # vLLM's worker process title (what a stack dump's command line shows)


def start_ranks(tensor_parallel_size: int, hung_rank: int, collective: str) -> list[subprocess.Popen[bytes]]:
    """Starts one process per rank (in the simulator's process group: stopping the engine stops them). Titled by
    argv[0], a rank's interpreter cannot find its environment from it: it gets the simulator's import path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    return [
        subprocess.Popen(
            [
                TITLE.format(rank=rank),
                "-m",
                "vllm_sim.workers.worker",
                str(rank),
                collective if rank == hung_rank else "",
            ],
            executable=sys.executable,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for rank in range(tensor_parallel_size)
    ]
