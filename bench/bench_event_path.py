"""How fast run events travel runner journal → gRPC (mTLS, loopback) → bot store, against the store alone.

The reference in the same run is the bot store's own insert rate for the same events, so the ratio is
the cost of the transport and the consumer. Run: `.venv/bin/python bench/bench_event_path.py [N]`.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from bot.config import parse_bot_config
from bot.consumer import follow_run
from bot.store import AsyncStore, Store
from kernel.tls import write_dev_certs
from protos import runner_pb2 as pb
from runner.config import parse_runner_config
from runner.daemon import RunnerDaemon

LINE = "(Worker_TP3 pid=4242) INFO 11-30 09:00:00 [gpu_model_runner.py:2345] Loading weights took 41.07 seconds"


async def bench(n: int, workdir: Path) -> tuple[float, float]:
    certs = write_dev_certs(workdir / "certs")
    runner_config = parse_runner_config(
        {
            "name": "bench",
            "cluster": "bench",
            "listen": "127.0.0.1:0",
            "state_dir": str(workdir / "runner"),
            "allowed_images": ["*"],
            "tls": {"cert": str(certs.runner_cert), "key": str(certs.runner_key), "client_ca": str(certs.ca)},
            "engine": {"backend": "sim"},
        },
        base=workdir,
        origin="bench",
    )
    daemon = RunnerDaemon(runner_config)
    port = await daemon.start()
    events = daemon.hub.events
    daemon.journal.add_run(pb.StartRunRequest(run_id="bench-run", cluster="bench"))
    for _ in range(n - 1):
        await events.emit("bench-run", log_chunk=pb.LogChunk(source="minimal_launch", lines=[LINE] * 20))
    await events.emit("bench-run", run_finished=pb.RunFinished(status=pb.RUN_STATUS_COMPLETED))
    journal = list(daemon.journal.events("bench-run", 0))

    reference = Store(workdir / "reference.db")
    reference.create_run({"id": "bench-run", "cluster": "bench", "status": "running"})
    started = time.perf_counter()
    for event in journal:
        reference.add_event(event)
    store_rate = n / (time.perf_counter() - started)
    reference.close()

    config = parse_bot_config(
        {
            "store": str(workdir / "bot.db"),
            "tls": {"ca": str(certs.ca), "cert": str(certs.bot_cert), "key": str(certs.bot_key)},
            "clusters": {},
        },
        base=workdir,
        origin="bench",
    )
    store = AsyncStore(config.store)
    await store.call(Store.create_run, {"id": "bench-run", "cluster": "bench", "status": "running"})
    received = 0

    async def count(_: pb.RunEvent) -> None:
        nonlocal received
        received += 1

    started = time.perf_counter()
    await follow_run(config, store, "bench-run", f"127.0.0.1:{port}", count)
    path_rate = n / (time.perf_counter() - started)
    store.close()
    await daemon.stop("bench done")
    assert received == n, (received, n)
    return path_rate, store_rate


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    with tempfile.TemporaryDirectory() as tmp:
        path_rate, store_rate = asyncio.run(bench(n, Path(tmp)))
    print(f"events: {n} log chunks of 20 lines each")
    print(f"runner journal -> gRPC mTLS -> bot store: {path_rate:,.0f} events/s")
    print(f"bot store inserts alone (reference):      {store_rate:,.0f} events/s")
    print(f"ratio (end-to-end / store alone):          {path_rate / store_rate:.2f}")


if __name__ == "__main__":
    main()
