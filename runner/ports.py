"""Free TCP ports for engine launches."""

from __future__ import annotations

import socket


def free_port(host: str) -> int:
    """A port that was free a moment ago; the engine binds it right away, so a race is unlikely."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
