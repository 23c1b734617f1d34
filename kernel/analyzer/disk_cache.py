"""The analyzer's on-disk cache ($XDG_CACHE_HOME/k3repro, ~/.cache by default): what it derives from the rules
between runs (Hyperscan databases, needle lists), loaded instead of derived again.

A file there steers the analysis: a Hyperscan database that matches nothing would make whole-file analysis jump
over every line, blind. So a file is used only when it, and every folder from k3repro down to it, belongs to this
user and no one else may write it: that is what keeps other users out (the folders are created 0700, the files
0600). Its content also carries a SHA-256 of itself and of the key it was derived under (the patterns, the needles
module's version): a file damaged, cut short, or copied under another name is not used either. (The digest is not
a secret: it cannot stop this user's own processes, which could rewrite it.) A file not used is ignored, with one
debug line, and derived again. Loading one costs an open per folder, an fstat each and the hash (1.6 GB/s with
the CPU's SHA instructions: 0.1 ms for a 200 KiB database).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
from pathlib import Path

_LOG = logging.getLogger(__name__)
_MAGIC = b"k3repro-cache 1 sha256 "
_HEAD_BYTES = len(_MAGIC) + 64 + 1  # the magic, the digest in hex, a line end


def cache_dir() -> Path:
    """Where the analyzer keeps what it derives from the rules between runs: $XDG_CACHE_HOME/k3repro
    (~/.cache by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "k3repro"


def load(path: Path, key: bytes) -> bytes | None:
    """What store(path, key, …) kept, or None: no such file, or one that is not to be trusted (see the module)."""
    folder = _folder(path, create=False)
    if folder is None:
        return None
    try:
        fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return None  # none stored yet (or a link, refused)
    finally:
        os.close(folder)
    try:
        with os.fdopen(fd, "rb") as file:
            if (problem := _untrusted(os.fstat(file.fileno()), regular=True)) is not None:
                _LOG.debug("cache file %s ignored: %s", path, problem)
                return None
            content = file.read()
    except OSError:
        return None
    head, payload = content[:_HEAD_BYTES], content[_HEAD_BYTES:]
    if head != _head(key, payload):
        _LOG.debug("cache file %s ignored: its digest does not match its content and key", path)
        return None
    return payload


def store(path: Path, key: bytes, payload: bytes) -> bool:
    """Keep payload under key at path (a file under cache_dir()): written whole (0600), then renamed, so that a
    reader sees the old file or the new one. False, and nothing written, where the cache folder cannot be used
    (a read-only home, a full disk, a folder another user could write)."""
    folder = _folder(path, create=True)
    if folder is None:
        return False
    temporary = f".{path.name}.{os.urandom(6).hex()}.tmp"
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(_head(key, payload))
                out.write(payload)
            os.replace(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            os.unlink(temporary, dir_fd=folder)
            raise
    except OSError:
        return False
    finally:
        os.close(folder)
    return True


def _head(key: bytes, payload: bytes) -> bytes:
    digest = hashlib.sha256(len(key).to_bytes(8, "big") + key + payload).hexdigest()
    return _MAGIC + digest.encode() + b"\n"


def _folder(path: Path, create: bool) -> int | None:
    """A descriptor of path's folder, each folder from cache_dir() down opened by the one above it and checked
    (so none can be swapped between the check and the use); created 0700 where create and missing."""
    top = cache_dir()
    try:
        parts = path.parent.relative_to(top).parts
    except ValueError:
        raise ValueError(f"{path} is not under the cache folder {top}") from None
    try:
        if create:
            top.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = _open_folder(str(top), None, create)
        for name in parts:
            if fd is None:
                break
            fd = _open_folder(name, fd, create)
    except OSError:
        return None
    return fd


def _open_folder(name: str, parent: int | None, create: bool) -> int | None:
    """The folder name (in parent, else absolute), created 0700 where create; None where it is not to be trusted.
    To write, this user's own folder that others may write (an older k3repro's, under a umask of 002) is made
    0700 first: its files are checked one by one, and from then on no one else can add one. Closes parent."""
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent)
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=parent)
    finally:
        if parent is not None:
            os.close(parent)
    status = os.fstat(fd)
    if create and status.st_uid == os.geteuid() and status.st_mode & 0o022:
        os.fchmod(fd, 0o700)
        status = os.fstat(fd)
    if (problem := _untrusted(status, regular=False)) is not None:
        _LOG.debug("cache folder %s ignored: %s", name, problem)
        os.close(fd)
        return None
    return fd


def _untrusted(status: os.stat_result, regular: bool) -> str | None:
    """Why a cache file or folder with this status is not to be used, or None."""
    if regular and not stat.S_ISREG(status.st_mode):
        return "not a regular file"
    if status.st_uid != os.geteuid():
        return f"owned by uid {status.st_uid}, not this user's"
    if status.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(status.st_mode):o})"
    return None
