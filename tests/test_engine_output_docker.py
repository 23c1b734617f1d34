"""The docker backend's pump against a real dockerd: an over-long line is cut, the lines after it still come."""

from __future__ import annotations

import asyncio
import io
import re
import tarfile
import time

from runner.config import DockerSettings
from runner.engines.docker import DockerBackend
from runner.engines.lines import LINE_LIMIT
from tests.dockerd import BUSYBOX, Dockerd

IMAGE = "k3repro/long-line:test"
ERROR = "(EngineCore_DP0 pid=9) ERROR 12-03 10:00:01 [core.py:700] torch.OutOfMemoryError: CUDA out of memory."
# 4 MiB without a newline (the pump joined and split it again at every piece docker sent), then the error
VLLM = '#!/bin/sh\nhead -c 4194304 /dev/zero | tr "\\0" x\necho\necho "$ERROR"\necho last\n'


def _import_image(dockerd: Dockerd) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(str(BUSYBOX), "bin/busybox")
        for applet in ("sh", "head", "tr"):
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        info = tarfile.TarInfo("bin/vllm")
        info.size, info.mode = len(VLLM), 0o755
        tar.addfile(info, io.BytesIO(VLLM.encode()))
    repository, tag = IMAGE.split(":")
    changes = ['ENTRYPOINT ["vllm", "serve"]']
    dockerd.client.api.import_image_from_data(buffer.getvalue(), repository=repository, tag=tag, changes=changes)


async def test_a_container_line_over_the_limit_is_cut_and_read_on(docker_env: Dockerd) -> None:
    _import_image(docker_env)
    backend = DockerBackend(DockerSettings(gpus=False, env=(("ERROR", ERROR),)))
    engine = await backend.launch(["vllm", "serve", "m"], run_id="r-long", image=IMAGE)
    started = time.monotonic()
    try:

        async def read() -> list[str]:
            return [line.text async for line in engine.lines()]

        texts = await asyncio.wait_for(read(), 20)
        assert await engine.wait() == 0
    finally:
        await engine.stop(1)
    assert time.monotonic() - started < 10
    # dockerd may hand a line this long over in more than one piece (it did on a loaded machine): each piece is cut
    # at the limit and counted, the 4 MiB are all accounted for, and the lines after it arrive, in order
    *pieces, error, last = texts
    assert (error, last) == (ERROR, "last") and pieces[0].startswith("x" * LINE_LIMIT + " [k3repro: ")
    seen = 0
    for piece in pieces:
        kept, _, marker = piece.partition(" [k3repro: ")
        assert set(kept) == {"x"} and len(kept) <= LINE_LIMIT
        dropped = re.search(r"^(\d+) more bytes", marker)
        seen += len(kept) + (int(dropped[1]) if dropped else 0)
    assert seen == 4 << 20
