"""TCP ports for engine launches, reserved so that two launches on one host never get the same one, and the
look-up of who listens on a port (a launch probes its own engine, never another process on its port).

A port is free a moment after a bind to port 0 says so; the engine binds it seconds later. Two runners (or two
runs of one runner) asking meanwhile can be given the same port by the kernel. So a runner holds a
reservation for the engine's whole life: a lock file per port under a shared directory
(`/tmp/k3repro-ports/<port>.lock`, `K3REPRO_PORTS_DIR` elsewhere) locked with `flock`, which every runner on
the host respects, and which the kernel drops when the runner dies (no stale reservation survives it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PORTS_DIR_ENV = "K3REPRO_PORTS_DIR"
DEFAULT_PORTS_DIR = Path(tempfile.gettempdir()) / "k3repro-ports"
ATTEMPTS = 200  # candidate ports tried before giving up (each one held by another launch, or taken)
TCP_LISTEN = "0A"  # /proc/net/tcp's state for a listening socket


def ports_dir() -> Path:
    return Path(os.environ.get(PORTS_DIR_ENV) or DEFAULT_PORTS_DIR)


@dataclass
class PortReservation:
    """A port and the locked file that reserves it; `release()` (or the runner's death) frees it."""

    port: int
    _fd: int | None = field(default=None, repr=False)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # closing drops the flock; the file stays (unlinking it would race another locker)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __del__(self) -> None:
        self.release()


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _bindable(host: str, port: int) -> bool:
    with socket.socket(_family(host)) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _lock(directory: Path, port: int) -> int | None:
    """The fd holding `<port>.lock` locked, or None when another launch holds it (or another user's file cannot
    be opened). Read-only and never through a link: the lock is all the file is for."""
    try:
        fd = os.open(directory / f"{port}.lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def reserve_port(host: str, directory: Path | None = None) -> PortReservation:
    """A port nobody listens on and no other launch on this host holds, reserved until released.

    The candidate comes from the kernel (a bind to port 0); a port whose lock another runner holds is skipped,
    and once locked the port is bound again to check nobody took it meanwhile without asking (a foreign server).
    """
    directory = directory or ports_dir()
    directory.mkdir(mode=0o1777, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # shared by every runner (user) on the host, sticky like /tmp
        os.chmod(directory, 0o1777)  # noqa: S103 (sticky: nobody removes another runner's lock file)
    for _ in range(ATTEMPTS):
        candidate = free_port(host)
        fd = _lock(directory, candidate)
        if fd is None:
            continue
        if _bindable(host, candidate):
            return PortReservation(candidate, fd)
        os.close(fd)
    raise OSError(errno.EADDRINUSE, f"no free port on {host} after {ATTEMPTS} tries (held by other launches)")


def free_port(host: str) -> int:
    """A port that was free a moment ago, not reserved: launches use reserve_port."""
    with socket.socket(_family(host)) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _listening_inodes(port: int) -> set[int] | None:
    """The socket inodes listening on TCP `port` (any address), or None when /proc cannot tell."""
    inodes: set[int] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as handle:
                lines = handle.readlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(fields[9]))
    return inodes if readable else None


def listener_pids(port: int) -> set[int] | None:
    """The processes holding a socket that listens on `port`, as far as /proc lets us see (processes of other
    users hide their fds: none of theirs is named); None when /proc says nothing about sockets."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes if inode}
    pids: set[int] = set()
    if not wanted:
        return pids
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            for fd in os.scandir(f"/proc/{entry.name}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(fd.path) in wanted:
                        pids.add(int(entry.name))
                        break
        except OSError:
            continue
    return pids


def process_line(pid: int) -> str:
    """`pid`'s command line, shortened, for a one-line report ("?" when it is gone or hidden)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            text = handle.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return "?"
    return text[:120] or "?"
