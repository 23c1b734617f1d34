"""Stacks of a stalled engine in a container, against a real dockerd: the collective-hang scenario's vllm-sim in
the busybox image of tests/test_docker_engine.py. An image without py-spy is reported as such; with py-spy in the
image (the runner's static binary, mounted), `docker exec` dumps the container's live processes and the same
summary names the odd rank out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from runner.stacks.dump import py_spy
from tests.dockerd import Dockerd
from tests.test_docker_engine import _docker_engine, _labelled, _run, sim_image

__all__ = ["sim_image"]  # a fixture used by name


def _engine() -> dict[str, Any]:
    """The docker engine of tests/test_docker_engine.py on collective-hang, its stall limit (wall seconds: a
    container's clock) short: the simulated start-up at speed 500 has no silence that long."""
    return {**_docker_engine("collective-hang", gpus=False), "stall_timeout_s": 5}


def _stacks(events: list[pb.RunEvent]) -> list[str]:
    return list(next(e.first_error for e in events if e.HasField("first_error")).stacks)


async def test_an_image_without_py_spy_is_reported_not_a_crash(
    docker_env: Dockerd, sim_image: str, certs: DevCerts, tmp_path: Path
) -> None:
    stacks = _stacks(await _run(certs, tmp_path, _engine()))
    assert len(stacks) == 2 and stacks[1].startswith("container k3repro-")
    assert stacks[1].endswith(": cannot attach: py-spy is not installed in the image")
    assert _labelled(docker_env) == []


async def test_py_spy_in_the_image_dumps_the_containers_ranks(
    docker_env: Dockerd, sim_image: str, certs: DevCerts, tmp_path: Path
) -> None:
    engine = _engine()
    engine["docker"]["volumes"].append(f"{py_spy()}:/bin/py-spy:ro")
    stacks = _stacks(await _run(certs, tmp_path, engine))
    assert stacks[0].startswith("rank 5 differs: waits in all_reduce (pynccl.py:"), stacks
    assert sum(line.startswith("rank ") for line in stacks[1:]) == 8 and "cannot attach" not in "".join(stacks)
    assert _labelled(docker_env) == []
