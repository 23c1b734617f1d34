"""The runner daemon: the gRPC server with health and reflection, and its orderly start and stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import grpc
from grpc_health.v1 import _async as health_aio  # the module behind grpc_health.v1.health.aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from runner.config import RunnerConfig
from runner.engines import make_backend
from runner.journal import Journal
from runner.runs import RunHub
from runner.service import RunnerService
from runner.tls import server_credentials

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Runner"].full_name
SHUTDOWN_REASON = "runner shutting down (SIGTERM)"
ONCE_GRACE_S = 10.0  # after its one run (`--once`): time for the bot to read the stream's last events


class RunnerDaemon:
    def __init__(self, config: RunnerConfig) -> None:
        self.config = config
        self.journal = Journal(config.journal_path)
        self.hub = RunHub(config, self.journal, make_backend(config.engine))
        self.health = health_aio.HealthServicer()
        self.server = grpc.aio.server()
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
        self.port = 0
        self._stopped = asyncio.Event()
        self._stopping: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Binds and starts serving; returns the bound port (useful with `listen = "127.0.0.1:0"`)."""
        recovered = await self.hub.recover()
        if recovered:
            log.warning("closed %d run(s) left unfinished by a previous runner process", len(recovered))
        if self.config.tls is None:
            self.port = self.server.add_insecure_port(self.config.listen)
        else:
            self.port = self.server.add_secure_port(self.config.listen, server_credentials(self.config.tls))
        if self.port == 0:
            raise OSError(f"cannot listen on {self.config.listen}")
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("runner %s (cluster %s) listening on port %d", self.config.name, self.config.cluster, self.port)
        return self.port

    async def stop(self, reason: str = SHUTDOWN_REASON, grace_s: float = 5.0) -> None:
        """Health goes NOT_SERVING first, then active runs are cancelled and reported, then the server stops."""
        await self.health.enter_graceful_shutdown()
        await self.hub.shutdown(reason)
        await self.server.stop(grace_s)
        self.journal.close()
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
