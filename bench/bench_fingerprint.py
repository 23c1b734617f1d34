"""How long a fingerprint takes and how much memory it needs, against bare Python start-up in the same run.

Ours: host facts + NVML, `docker image inspect`, and the probe in a container of a vLLM-like image, with
the cost of starting and removing an empty container of that image (measured alongside) taken out; and
the whole `--python` fingerprint, which needs no container. Reference: `python -c "import importlib.metadata"`,
the least any Python-based version check costs. Peak memory: a process that takes a `--python`
fingerprint against the same reference process. Needs Docker (docker.io) and busybox-static, as the tests.
Run: `.venv/bin/python bench/bench_fingerprint.py [REPEATS]`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from kernel.redact import redactor
from runner.fingerprint import ImageTarget, PythonTarget, collect
from runner.fingerprint.collect import host_facts
from runner.fingerprint.image import docker_client, inspect_image, probe_image
from runner.nvml import PynvmlSource
from tests.dockerd import running_dockerd

IMAGE = "vllm/vllm-openai:kimi-k3"
# Each child prints its own peak RSS (VmHWM: per address space, so the forked parent does not count).
PEAK = "; print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))"
REFERENCE = [sys.executable, "-c", "import importlib.metadata" + PEAK]
OURS = [
    sys.executable,
    "-c",
    "import sys; from runner.fingerprint import PythonTarget, collect; from runner.nvml import PynvmlSource; "
    "collect(PynvmlSource(), PythonTarget(sys.executable)); assert 'torch' not in sys.modules" + PEAK,
]


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def child(argv: list[str]) -> tuple[float, float]:
    """Wall time (ms) and peak RSS (MiB) of one process."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return (time.perf_counter() - start) * 1000, int(done.stdout.split()[-1]) / 1024


def main(repeats: int) -> None:
    with running_dockerd() as engine:
        os.environ["DOCKER_HOST"] = engine.url
        client = docker_client()
        nvml = PynvmlSource()
        host = median_ms(lambda: (host_facts(), nvml.read()), repeats)
        inspect = median_ms(lambda: inspect_image(client, IMAGE, redactor()), repeats)
        probe = median_ms(lambda: probe_image(client, IMAGE, gpus=False), repeats)
        empty = median_ms(
            lambda: client.containers.run(IMAGE, [":"], entrypoint=["/bin/sh", "-c"], network_mode="none", remove=True),
            repeats,
        )
        image_total = median_ms(lambda: collect(nvml, ImageTarget(IMAGE)), repeats)
        python_total = median_ms(lambda: collect(nvml, PythonTarget(sys.executable)), repeats)
        client.close()
    ours_no_start = image_total - empty
    reference_ms = statistics.median(child(REFERENCE)[0] for _ in range(repeats))
    ours_rss = max(child(OURS)[1] for _ in range(3))
    reference_rss = max(child(REFERENCE)[1] for _ in range(3))
    print(f"fingerprint time, median of {repeats} (in-process):")
    print(f"  host facts + NVML                          {host:8.1f} ms")
    print(f"  docker image inspect                       {inspect:8.1f} ms")
    print(f"  probe container (create, run, remove)      {probe:8.1f} ms")
    print(f"  empty container of the image (sh -c :)      {empty:8.1f} ms   <- container start, excluded")
    print(f"  --image fingerprint, excluding start       {ours_no_start:8.1f} ms   (whole: {image_total:.1f} ms)")
    print(f"  --python fingerprint (no container)        {python_total:8.1f} ms")
    print(f'reference: python -c "import importlib.metadata"  {reference_ms:8.1f} ms (process wall time)')
    print(f"ratio --image (excl. start) / reference      {ours_no_start / reference_ms:8.2f}")
    print(f"ratio --python / reference                   {python_total / reference_ms:8.2f}")
    print(
        f"peak RSS: --python fingerprint process {ours_rss:.1f} MiB vs reference {reference_rss:.1f} MiB "
        f"(ratio {ours_rss / reference_rss:.2f}); torch never imported"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
