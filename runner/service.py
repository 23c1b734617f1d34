"""The Runner gRPC service: the contract in protos/runner.proto, served by the RunHub."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from importlib.metadata import version
from typing import Any

import grpc

from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from runner.runs import RunHub, RunRejected


class RunnerService(pb_grpc.RunnerServicer):
    def __init__(self, hub: RunHub) -> None:
        self.hub = hub

    async def Describe(
        self,
        request: pb.DescribeRequest,
        context: grpc.aio.ServicerContext[pb.DescribeRequest, pb.RunnerDescription],
    ) -> pb.RunnerDescription:
        config = self.hub.config
        return pb.RunnerDescription(
            name=config.name,
            cluster=config.cluster,
            labels=list(config.labels),
            hostname=socket.gethostname(),
            backend=self.hub.backend.name,
            active_run_ids=list(self.hub.active),
            max_concurrent_runs=config.max_concurrent_runs,
            version=version("k3repro"),
            allowed_images=list(config.allowed_images),
        )

    async def StartRun(
        self, request: pb.StartRunRequest, context: grpc.aio.ServicerContext[pb.StartRunRequest, pb.RunEvent]
    ) -> AsyncIterator[pb.RunEvent]:
        try:
            self.hub.start(request)
        except RunRejected as exc:
            await _abort(context, exc)
        async for event in self.hub.watch(request.run_id, 0):
            yield event

    async def WatchRun(
        self, request: pb.WatchRunRequest, context: grpc.aio.ServicerContext[pb.WatchRunRequest, pb.RunEvent]
    ) -> AsyncIterator[pb.RunEvent]:
        try:
            stream = self.hub.watch(request.run_id, request.after_seq)
            async for event in stream:
                yield event
        except RunRejected as exc:
            await _abort(context, exc)

    async def CancelRun(
        self,
        request: pb.CancelRunRequest,
        context: grpc.aio.ServicerContext[pb.CancelRunRequest, pb.CancelRunResponse],
    ) -> pb.CancelRunResponse:
        reason = request.reason or f"cancelled by {request.requested_by or 'an operator'}"
        try:
            cancelled = await self.hub.cancel(request.run_id, reason)
        except RunRejected as exc:
            await _abort(context, exc)
        message = "cancelled" if cancelled else "the run had already finished"
        return pb.CancelRunResponse(cancelled=cancelled, message=message)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: RunRejected) -> None:
    await context.abort(grpc.StatusCode[exc.code], str(exc))
