"""Engine ports under load: launches on one host never share a port, and a launch never probes a server that is
not its own engine."""

from __future__ import annotations

import multiprocessing
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kernel.tls import DevCerts
from protos import runner_pb2 as pb
from runner import ports
from runner.ports import PortReservation, listener_pids, reserve_port
from runner.stages import launcher
from tests.k3fixtures import run_to_end, runner_data

pytestmark = pytest.mark.sim

RUNNERS = 6  # runner processes launching at once
LAUNCHES = 40  # launches each


def _runner(directory: str, seed: int, out: multiprocessing.Queue, done: Any) -> None:  # type: ignore[type-arg]
    """A runner's launches: reserve, start the engine a moment later (it binds the port and listens), live a
    while, stop. Reports the ports and every bind that failed (another launch's engine had the port), then keeps
    its last engines until every runner has reported (`done`), so the ports reported are all held at once."""
    rng = random.Random(seed)
    held: list[tuple[PortReservation, socket.socket]] = []
    got, clashes = [], 0
    for _ in range(LAUNCHES):
        reservation = reserve_port("127.0.0.1", Path(directory))
        got.append(reservation.port)
        time.sleep(rng.uniform(0, 0.005))  # the engine's start-up, before it binds
        engine = socket.socket()
        engine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vLLM and vllm-sim bind
        try:
            engine.bind(("127.0.0.1", reservation.port))
            engine.listen()
        except OSError:
            clashes += 1
        held.append((reservation, engine))
        if len(held) > 8 or rng.random() < 0.3:  # engines end, ports are freed for the next launches
            old, sock = held.pop(rng.randrange(len(held)))
            sock.close()
            old.release()
    out.put((got, clashes, [r.port for r, _ in held]))
    done.wait(60)
    for reservation, sock in held:
        sock.close()
        reservation.release()


def test_runners_launching_at_once_never_share_a_port(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    out, done = context.Queue(), context.Event()
    workers = [context.Process(target=_runner, args=(str(tmp_path), n, out, done)) for n in range(RUNNERS)]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=60) for _ in workers]
    done.set()
    for worker in workers:
        worker.join(timeout=10)
    assert sum(len(got) for got, _, _ in results) == RUNNERS * LAUNCHES
    assert sum(clashes for _, clashes, _ in results) == 0
    live = [port for _, _, held in results for port in held]  # held by every runner at the same moment
    assert len(live) == len(set(live))


def test_a_held_reservation_is_skipped_and_freed_on_release(tmp_path: Path) -> None:
    first = reserve_port("127.0.0.1", tmp_path)
    seen = set()
    for _ in range(100):
        other = reserve_port("127.0.0.1", tmp_path)
        seen.add(other.port)
        other.release()
    assert first.port not in seen
    assert ports._lock(tmp_path, first.port) is None  # another locker is refused while it is held
    first.release()
    fd = ports._lock(tmp_path, first.port)
    assert fd is not None
    os.close(fd)


async def test_a_foreign_server_on_the_launch_port_is_reported_not_probed(
    certs: DevCerts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process already serves /health 200 on the port the launch was given: the launch says so in one
    line and sends it nothing but that /health."""
    paths: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        paths.append(request.path)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    server = web.AppRunner(app, access_log=None)
    await server.setup()
    site = web.TCPSite(server, "127.0.0.1", 0)
    await site.start()
    port = server.addresses[0][1]
    assert listener_pids(port) == {os.getpid()}
    monkeypatch.setattr(launcher, "reserve_port", lambda host: PortReservation(port))
    try:
        events = await run_to_end(certs, tmp_path, runner_data(certs, tmp_path / "runner"))
    finally:
        await server.cleanup()
    summaries = [e.stage_finished.summary for e in events if e.HasField("stage_finished")]
    minimal = next(s for s in summaries if "not by this launch's engine" in s)
    assert f"port {port} is served by pid {os.getpid()} (" in minimal
    assert "\n" not in minimal
    assert set(paths) == {"/health"}  # never probed beyond the identity check
    assert events[-1].run_finished.decision != pb.DECISION_UNSPECIFIED


async def test_the_engines_own_port_is_recognised(certs: DevCerts, tmp_path: Path) -> None:
    events = await run_to_end(certs, tmp_path, runner_data(certs, tmp_path / "runner"))
    summaries = [e.stage_finished.summary for e in events if e.HasField("stage_finished")]
    assert not any("not by this launch's engine" in s for s in summaries)
    assert any("API answered" in s for s in summaries)
    assert not launcher._reserved  # every reservation was freed with its engine
