"""What one gRPC message between a runner and a bot may weigh, agreed by both sides: the runner's server
(runner/daemon.py SERVER_OPTIONS) and the bot's channels (bot/runner_client.py) both set MESSAGE_OPTIONS, and the
runner cuts its log chunks (runner/stages/log_follower.py) to LOG_CHUNK_BYTES, far under the limit.

gRPC's own default (4 MiB received, unlimited sent) would let one burst of engine output become an event the bot
cannot read: the stream fails, the run is recorded as lost, and replaying it (`watch`) fails the same way."""

from __future__ import annotations

MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # one message, sent or received, on either side
LOG_CHUNK_BYTES = 1024 * 1024  # a log chunk is sent before its lines would weigh more than this
MESSAGE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
