"""Channels to runner daemons: mTLS when configured, keepalives so a dead peer is noticed."""

from __future__ import annotations

import grpc

from bot.config import ClientTls
from protos import runner_pb2 as pb
from protos import runner_pb2_grpc as pb_grpc
from protos.limits import MESSAGE_OPTIONS

KEEPALIVE_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
)
# What the bot's channels are opened with: the keepalives, and the message size limits the runner sets too.
CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (*KEEPALIVE_OPTIONS, *MESSAGE_OPTIONS)


def open_channel(address: str, tls: ClientTls | None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca.read_bytes(),
        private_key=tls.key.read_bytes() if tls.key else None,
        certificate_chain=tls.cert.read_bytes() if tls.cert else None,
    )
    options = CHANNEL_OPTIONS
    if tls.server_name:
        options = (*options, ("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(address, credentials, options=options)


async def describe(address: str, tls: ClientTls | None, timeout_s: float) -> pb.RunnerDescription:
    async with open_channel(address, tls) as channel:
        return await pb_grpc.RunnerStub(channel).Describe(pb.DescribeRequest(), timeout=timeout_s)


def rpc_error_text(error: grpc.aio.AioRpcError) -> str:
    """One line for a person: the status and the runner's message, without gRPC's debug dump."""
    details = (error.details() or "").splitlines()
    text = details[0] if details else ""
    return f"{error.code().name.lower()}: {text}" if text else error.code().name.lower()
