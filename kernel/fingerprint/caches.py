"""The caches in the scene: where each cache vLLM and its libraries use lives on this host, and what is in it.

The list is kernel/data/caches.toml. Each cache is walked with a cap on entries and on time, in sorted order
(so a cap cuts at the same place twice), never following a symlink and never opening a file: what is recorded
is its location, total size, entry count, newest entry's mtime and the sha256 of its sorted index of relative
paths and sizes, so two scenes with different cache contents differ (`k3repro diff`). These are the host's
paths: with the docker backend the engine's caches live inside the container (or its mounts), which this
section does not see; it says so (`"host": true` and a note).
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from typing import Any

from kernel.clock import WALL
from kernel.redact import Redactor
from kernel.toml_reader import packaged

MAX_ENTRIES = 20_000  # per cache: a compile cache has thousands; past this the walk stops and says so
MAX_SECONDS = 1.5  # per cache: a slow or huge filesystem must not hold the freeze
_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class CacheSpec:
    name: str
    env: str
    defaults: tuple[str, ...]
    env_subdir: str = ""  # where the cache is under the folder `env` names ("": that folder itself)


@cache
def cache_specs() -> tuple[CacheSpec, ...]:
    specs = []
    for reader in packaged("caches.toml").rows("cache"):
        specs.append(
            CacheSpec(
                reader.text("name"),
                reader.text("env"),
                tuple(reader.texts("defaults")),
                reader.text("env_subdir", ""),
            )
        )
    return tuple(specs)


def location(spec: CacheSpec, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """(path, how it was found: the env var's name or "default"); (None, why) when no default can be spelt."""
    if environ.get(spec.env):
        base = _expand(environ[spec.env], environ)
        if base is not None and spec.env_subdir:
            base = f"{base.rstrip('/')}/{spec.env_subdir}"
        return base, spec.env
    for default in spec.defaults:
        path = _expand(default, environ)
        if path is not None:
            return path, "default"
    return None, "default"


def _expand(template: str, environ: Mapping[str, str]) -> str | None:
    """`~` and `$VAR`/`${VAR}` from `environ` ($HOME and $USER of this process when it has none); None when a
    variable is unset."""
    values = dict(environ)
    values.setdefault("HOME", os.path.expanduser("~"))
    if "USER" not in values:
        with contextlib.suppress(KeyError, OSError):
            values["USER"] = getpass.getuser()
    if template == "~" or template.startswith("~/"):
        template = "$HOME" + template[1:]
    missing = [
        m.group(1) or m.group(2) for m in _VARIABLE.finditer(template) if not values.get(m.group(1) or m.group(2))
    ]
    if missing:
        return None
    return _VARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], template)


def survey(path: str, *, max_entries: int = MAX_ENTRIES, max_seconds: float = MAX_SECONDS) -> dict[str, Any]:
    """What a cache folder holds, walked without following symlinks or reading any file."""
    result: dict[str, Any] = {
        "exists": False,
        "size_bytes": None,
        "entries": None,
        "newest_mtime": None,
        "index_sha256": None,
        "truncated": None,  # "entries" / "time" when the walk stopped at its cap
        "error": None,
    }
    try:
        top = os.lstat(path)
    except FileNotFoundError:
        return result
    except OSError as exc:
        return {**result, "error": exc.strerror or str(exc)}
    if not stat.S_ISDIR(top.st_mode):
        kind = "a symlink" if stat.S_ISLNK(top.st_mode) else "not a directory"
        return {**result, "exists": True, "error": f"{kind}; not walked"}
    walk = _walk(path, max_entries, WALL.monotonic() + max_seconds)
    newest = datetime.fromtimestamp(walk.newest, UTC).isoformat(timespec="seconds") if walk.entries else None
    return {
        **result,
        "exists": True,
        "size_bytes": walk.size,
        "entries": walk.entries,
        "newest_mtime": newest,
        "index_sha256": walk.index.hexdigest(),
        "truncated": walk.truncated,
        "error": f"{walk.unreadable} folder(s) or entries could not be read" if walk.unreadable else None,
    }


@dataclass
class _Walk:
    """What a walk counted so far; `index` hashes each entry's relative path (and a file's size) in walk order."""

    index: hashlib._Hash = field(default_factory=hashlib.sha256)
    size: int = 0
    entries: int = 0
    newest: float = 0.0
    unreadable: int = 0
    truncated: str | None = None  # "entries" / "time" when the walk stopped at its cap

    def count(self, relative: str, info: os.stat_result) -> bool:
        """Counts one entry; True for a folder (to walk next), whose size is not counted."""
        self.entries += 1
        self.newest = max(self.newest, info.st_mtime)
        if stat.S_ISDIR(info.st_mode):
            self.index.update(f"{relative}/\n".encode("utf-8", "surrogateescape"))
            return True
        length = info.st_size if stat.S_ISREG(info.st_mode) else 0
        self.size += length
        self.index.update(f"{relative}\t{length}\n".encode("utf-8", "surrogateescape"))
        return False


def _walk(path: str, max_entries: int, deadline: float) -> _Walk:
    """Walks the folder depth-first in sorted order without following symlinks, until a cap stops it."""
    walk = _Walk()
    pending = [""]  # relative folders still to list
    while pending and walk.truncated is None:
        folder = pending.pop()
        try:
            with os.scandir(os.path.join(path, folder)) as listing:
                found = sorted(listing, key=lambda e: e.name)
        except OSError:
            walk.unreadable += 1
            continue
        below = []
        for entry in found:
            if walk.entries >= max_entries:
                walk.truncated = "entries"
                break
            if WALL.monotonic() > deadline:
                walk.truncated = "time"
                break
            relative = f"{folder}/{entry.name}" if folder else entry.name
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                walk.unreadable += 1
                continue
            if walk.count(relative, info):
                below.append(relative)
        pending.extend(reversed(below))
    return walk


def caches_section(environ: Mapping[str, str], redact: Redactor, *, image: bool = False) -> dict[str, Any]:
    """The fingerprint's `caches`: each cache's location on this host and what it holds."""
    found = []
    for spec in cache_specs():
        path, source = location(spec, environ)
        entry: dict[str, Any] = {"name": spec.name, "env": spec.env, "from": source, "path": None}
        if path is None:
            found.append({**entry, **survey(""), "error": "no location: its variables are unset"})
            continue
        found.append({**entry, "path": redact.line(path), **survey(path)})
    note = "the host's paths only"
    if image:
        note += "; the engine runs in a container, whose own caches (inside the image or its mounts) are not recorded"
    return {"host": True, "note": note, "caches": found}


def summary(entry: dict[str, Any] | None) -> str:
    """One cache in a few words, for `k3repro diff`."""
    if not entry or not entry.get("exists"):
        return "absent" if entry else "(not recorded)"
    cut = f", cut at its {entry['truncated']} cap" if entry.get("truncated") else ""
    return (
        f"{entry.get('path')}: {entry.get('entries')} entries, {entry.get('size_bytes')} bytes, newest "
        f"{entry.get('newest_mtime')}, index {str(entry.get('index_sha256'))[:12]}{cut}"
    )
