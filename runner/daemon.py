"""The runner daemon: the gRPC server with health and reflection, and its orderly start and stop.

One daemon per state dir (an exclusive lock) and per port (no SO_REUSEPORT): a second daemon on the same
config would otherwise close the first one's live run as a leftover, and split the bots' connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import socket
import sqlite3
from pathlib import Path
from typing import IO

import grpc
from aiohttp import web
from grpc_health.v1 import _async as health_aio  # the module behind grpc_health.v1.health.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from kernel.tls import pem_problem, server_credentials
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from protos.limits import MESSAGE_OPTIONS
from runner.config import RunnerConfig, is_loopback
from runner.engines import make_backend
from runner.journal import Journal
from runner.metrics import RunnerMetrics
from runner.runs import RunHub
from runner.service import RunnerService

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Runner"].full_name
SHUTDOWN_REASON = "runner shutting down (SIGTERM)"
ONCE_GRACE_S = 10.0  # after its one run (`--once`): time for the bot to read the stream's last events
# The bot pings every 20 s, with or without a call in flight (bot/runner_client.py KEEPALIVE_OPTIONS): the
# server permits pings that often, so it never answers GOAWAY too_many_pings. tests/test_security_faults.py
# checks the two sides agree.
MIN_PING_INTERVAL_MS = 10_000
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
    ("grpc.http2.max_ping_strikes", 0),
    *MESSAGE_OPTIONS,  # the message size limits the bot's channels set too (protos/limits.py)
)


class DaemonStartError(Exception):
    """The daemon cannot start (state dir in use or unwritable, port taken, unusable TLS files); one line."""


def check_start(config: RunnerConfig) -> str:
    """What start-up checks before it creates anything (the TLS files, readable PEM; the state dir, usable),
    without binding, locking or writing: `k3repro-runner serve --check-config`. Returns how the runner would
    serve, in a few words; DaemonStartError (one line) when it could not start."""
    if config.tls is not None:
        _check_pem(config.tls.cert, config.tls.key, config.tls.client_ca)
    _check_state_dir(config.state_dir)
    return (
        f"runner {config.name}, cluster {config.cluster}, backend {config.engine.backend}, "
        f"listen {config.listen} ({_transport(config)})"
    )


def _transport(config: RunnerConfig) -> str:
    if config.mutual_tls:
        return "mTLS"
    if is_loopback(config.listen):
        return "loopback, no mTLS"
    return "INSECURE: no mTLS"


def _warn_transport(config: RunnerConfig) -> None:
    """A runner without mTLS says so at every start: loudly where other hosts may reach it (insecure = true; the
    config refuses it otherwise), once more quietly on loopback."""
    if config.mutual_tls:
        return
    if is_loopback(config.listen):
        log.warning(
            "runner %s serves gRPC on %s without mTLS: any process on this host can start runs",
            config.name,
            config.listen,
        )
    else:
        log.warning(
            "INSECURE: runner %s serves gRPC on %s WITHOUT mTLS (insecure = true): anyone who reaches this port can "
            "start runs and read their logs; configure [tls] cert, key and client_ca",
            config.name,
            config.listen,
        )


class RunnerDaemon:
    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        if config.tls is not None:  # before anything is created: a refused start leaves nothing behind
            _check_pem(config.tls.cert, config.tls.key, config.tls.client_ca)
        self._lock = _lock_state_dir(config.state_dir)
        try:
            self.journal = Journal(config.journal_path, config.retention)
        except sqlite3.Error as exc:
            self._lock.close()
            raise DaemonStartError(f"cannot open the journal {config.journal_path}: {exc}") from None
        self.hub = RunHub(config, self.journal, make_backend(config.engine))
        self.health = health_aio.HealthServicer()
        self.server = grpc.aio.server(options=SERVER_OPTIONS)
        pb_grpc.add_RunnerServicer_to_server(RunnerService(self.hub), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (
                SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )
        self.metrics: RunnerMetrics | None = None
        self._metrics_site: web.AppRunner | None = None
        if config.metrics_listen:
            active = self.hub.active
            self.metrics = RunnerMetrics(
                config.name, config.cluster, config.engine.backend, config.journal_path, lambda: len(active)
            )
            self.hub.events.observers.append(self.metrics.observe)
        self.port = 0
        self.metrics_port = 0  # the bound port of `[metrics] listen`, 0 when it is off
        self._stopped = asyncio.Event()
        self._stopping: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Binds, closes what a previous process left, and starts serving; returns the bound port (useful
        with `listen = "127.0.0.1:0"`). Binding comes first: a daemon that cannot serve touches nothing."""
        _warn_transport(self.config)
        _check_bindable(self.config.listen)
        try:
            if self.config.tls is None:
                self.port = self.server.add_insecure_port(self.config.listen)
            else:
                self.port = self.server.add_secure_port(self.config.listen, server_credentials(self.config.tls))
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            raise DaemonStartError(f"cannot listen on {self.config.listen} (in use, or not an address of this host)")
        if self.metrics is not None:
            await self._serve_metrics(self.metrics)
            view = await asyncio.to_thread(self.hub.backend.nvml.read)
            self.metrics.gpus = len(view.gpus) if view.available else 0
        recovered = await self.hub.recover()
        if recovered:
            log.warning("closed %d run(s) left unfinished by a previous runner process", len(recovered))
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("runner %s (cluster %s) listening on port %d", self.config.name, self.config.cluster, self.port)
        return self.port

    async def _serve_metrics(self, metrics: RunnerMetrics) -> None:
        """The Prometheus endpoint on its own address: scraped over plain HTTP, apart from the mTLS gRPC port."""
        listen = self.config.metrics_listen
        _check_bindable(listen)
        host, _, port = listen.rpartition(":")
        runner = web.AppRunner(metrics.app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host.strip("[]"), int(port)).start()
        except OSError as exc:
            await runner.cleanup()
            raise DaemonStartError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
        self._metrics_site = runner
        self.metrics_port = int(runner.addresses[0][1])

    async def stop(self, reason: str = SHUTDOWN_REASON, grace_s: float = 5.0) -> None:
        """Health goes NOT_SERVING first, then active runs are cancelled and reported, then the server stops."""
        await self.health.enter_graceful_shutdown()
        await self.hub.shutdown(reason)
        await self.server.stop(grace_s)
        if self._metrics_site is not None:
            await self._metrics_site.cleanup()
        self.journal.close()
        self._lock.close()
        self._stopped.set()

    def _on_signal(self) -> None:
        if self._stopping is None:
            self._stopping = asyncio.create_task(self.stop())

    async def serve_until_signalled(self, port_file: Path | None = None) -> None:
        """Serves until SIGTERM/SIGINT, or, with `hub.once`, until its one run has ended."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)
        port = await self.start()
        if port_file is not None:
            partial = port_file.with_name(port_file.name + ".partial")
            partial.write_text(f"{port}\n")
            partial.replace(port_file)  # the reader never sees half a number
        if self.hub.once:
            served = asyncio.create_task(self.hub.served.wait())
            stopped = asyncio.create_task(self._stopped.wait())
            await asyncio.wait([served, stopped], return_when=asyncio.FIRST_COMPLETED)
            served.cancel()
            stopped.cancel()
            if self._stopping is None:
                self._stopping = asyncio.create_task(self.stop("served its one run", grace_s=ONCE_GRACE_S))
        await self._stopped.wait()


def _lock_state_dir(state_dir: Path) -> IO[str]:
    """Holds `runner.lock` in the state dir for the daemon's life (the kernel drops it when the process dies,
    so a SIGKILLed runner never blocks its successor)."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        handle = open(state_dir / "runner.lock", "a+", encoding="utf-8")  # noqa: SIM115 - held until stop
    except OSError as exc:
        raise DaemonStartError(f"cannot use state_dir {state_dir}: {exc.strerror}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise DaemonStartError(f"state_dir {state_dir} is in use by another runner (pid {holder})") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
    except OSError as exc:  # a full disk: the lock is ours, but nothing could be kept here
        with contextlib.suppress(OSError):  # closing flushes again, and fails again (the file is closed all the same)
            handle.close()
        raise DaemonStartError(f"cannot use state_dir {state_dir}: {exc.strerror}") from None
    return handle


def _check_pem(*paths: Path | None) -> None:
    for path in paths:
        problem = pem_problem(path) if path is not None else None
        if problem is not None:
            raise DaemonStartError(f"TLS: {problem}")


def _check_state_dir(state_dir: Path) -> None:
    """The state dir is a writable directory, or can be made in the nearest folder that exists (nothing is made)."""
    existing = state_dir
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise DaemonStartError(f"cannot use state_dir {state_dir}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise DaemonStartError(f"cannot use state_dir {state_dir}: {existing} is not writable")


def _check_bindable(listen: str) -> None:
    """Binds the address once, so a taken port or a foreign address is our one line rather than gRPC's log."""
    host, _, port = listen.rpartition(":")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds: TIME_WAIT is no conflict
            probe.bind(address)
    except OSError as exc:
        raise DaemonStartError(f"cannot listen on {listen}: {exc.strerror or exc}") from None
