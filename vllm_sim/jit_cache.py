"""A JIT kernel cache, kept where the real server's libraries keep theirs (a scenario's [jit_cache]).

The folder is found the way the freeze finds it (kernel/data/caches.toml: the cache's variable, else its defaults),
so a launch the runner gives fresh caches (runner/engines/fresh_caches.py) reads an empty one. At engine_init the
simulator reads the kernels it holds: a kernel another build wrote (a stale cache, e.g. left by an older image on
a shared home) fails the start, with a different error from launch to launch, as reused compiled artifacts do;
an empty cache is compiled into (the scenario's build) and the start goes on. A cache folder the runner made
empty for a control launch exists: only a missing one gets the older image's kernels (`left_by`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kernel.fingerprint.caches import cache_specs, location

KERNELS = "k3repro-sim-kernels"  # the simulator's own folder inside the cache: nothing else there is read


@dataclass(frozen=True)
class JitCache:
    cache: str  # a cache of kernel/data/caches.toml, e.g. "flashinfer"
    build: str  # what this image's kernels are built as; a kernel of another build is stale
    errors: tuple[str, ...]  # what a stale kernel raises, launch after launch (catalog keys or error texts)
    left_by: str = ""  # the build an older image left in the host's cache: written where no cache folder exists yet


def folder(cache: str) -> Path | None:
    """Where this launch's `cache` keeps the simulator's kernels (None when its variables leave it nowhere)."""
    spec = next(s for s in cache_specs() if s.name == cache)
    path, _ = location(spec, os.environ)
    return Path(path) / KERNELS if path else None


def _unused(cache: str, kernels: Path) -> bool:
    """Whether nothing of this cache exists yet: neither it nor the folder its variable names (a control
    launch's, which the runner made empty)."""
    spec = next(s for s in cache_specs() if s.name == cache)
    named = os.environ.get(spec.env)
    return not kernels.parent.exists() and not (named and Path(named).expanduser().exists())


def stale_error(jit: JitCache, launch: int) -> str:
    """The error a stale kernel raises at this launch ("" when the cache holds none of another build)."""
    kernels = folder(jit.cache)
    if kernels is None:
        return ""
    if jit.left_by and _unused(jit.cache, kernels):  # this host's cache, as the older image left it
        write(jit.cache, jit.left_by)
    if not kernels.is_dir():
        return ""
    stale = [k for k in sorted(kernels.iterdir()) if k.is_file() and k.read_text(errors="replace") != jit.build]
    return jit.errors[(max(launch, 1) - 1) % len(jit.errors)] if stale else ""


def compile_into(jit: JitCache) -> None:
    """What a successful engine_init leaves: this build's kernel in the cache."""
    write(jit.cache, jit.build)


def write(cache: str, build: str) -> None:
    """A kernel of `build` in `cache` (a test leaves an older build's, as an older image would)."""
    kernels = folder(cache)
    if kernels is not None:
        kernels.mkdir(parents=True, exist_ok=True)
        (kernels / f"fused_moe_{build}.so").write_text(build)
