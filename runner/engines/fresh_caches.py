"""Fresh, empty caches for one launch: each cache of kernel/data/caches.toml moved by its own variable.

The fresh-cache control launch (runner/stages/cache_control.py) asks its backend for them; the host's caches are
never touched, let alone deleted. A process engine gets new folders under the run's work dir on the runner's host
(they stay, so the control can be read afterwards); a container engine gets paths inside its own filesystem, which
is new with every container, so nothing of the host needs to be shared with the Docker daemon or the kubelet.
"""

from __future__ import annotations

import os
from pathlib import Path

from kernel.fingerprint.caches import cache_specs

# Where a container engine's fresh caches live: inside the container's own (new, empty) filesystem, not a mount.
CONTAINER_ROOT = "/tmp/k3repro-fresh-caches"  # noqa: S108 - the new container's own /tmp, not the host's


def redirect(root: str) -> dict[str, str]:
    """Each cache's variable, pointed at `root`/<cache name>: set for one launch, after the engine env allowlist
    (the runner sets these itself; the host's values of them are what the control launch leaves out)."""
    return {spec.env: f"{root.rstrip('/')}/{spec.name}" for spec in cache_specs()}


def make_fresh(root: Path) -> dict[str, str]:
    """`redirect(root)` with each folder created empty; a folder that already holds anything is refused, because
    a control launch on a used cache would prove nothing."""
    env = redirect(str(root))
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
        with os.scandir(path) as entries:
            if next(entries, None) is not None:
                raise FileExistsError(f"{path} is not empty: a fresh-cache control needs empty caches")
    return env
