"""Taking a fingerprint: host, NVML, the image, what loads, env, argv and change log, sealed with sha256."""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernel.clock import WALL
from kernel.fingerprint.caches import caches_section
from kernel.fingerprint.document import SCHEMA, rules, seal
from kernel.redact import Redactor, redactor
from runner.fingerprint.image import DockerUnavailable, docker_client, inspect_image, probe_image, unavailable_image
from runner.fingerprint.probe import run_python_probe, runtime_section
from runner.nvml import NvmlSource


@dataclass(frozen=True)
class ImageTarget:
    """Probe what loads inside a container of this image."""

    ref: str


@dataclass(frozen=True)
class PythonTarget:
    """Probe what loads for this Python (a bare-metal install)."""

    path: str
    env: tuple[tuple[str, str], ...] = ()  # set for the probe: where that install's environment differs from ours


Target = ImageTarget | PythonTarget


@dataclass(frozen=True)
class FixedRequest:
    """The request the run sends; `hashed` keeps only its digest in the scene (prompts can be confidential)."""

    api: str
    body_json: str
    repeats: int
    hashed: bool = False

    def section(self, redact: Redactor) -> dict[str, Any]:
        digest = hashlib.sha256(self.body_json.encode()).hexdigest()
        body = None if self.hashed else redact.line(self.body_json)
        return {"api": self.api, "repeats": self.repeats, "body_sha256": digest, "body": body}


@dataclass(frozen=True)
class Change:
    at: str
    what: str
    by: str = ""


def host_facts() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "os": _os_name(),
        "kernel": platform.release(),
        "arch": platform.machine(),
    }


def _os_name() -> str | None:
    try:
        for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition("=")
            if key == "PRETTY_NAME":
                return value.strip().strip('"')
    except OSError:
        return None
    return None


def relevant_env(environ: Mapping[str, str], redact: Redactor) -> dict[str, str]:
    return redact.env({k: v for k, v in sorted(environ.items()) if rules().wants_env(k)})


def collect(
    nvml: NvmlSource,
    target: Target | None,
    *,
    argv: Sequence[str] = (),
    changes: Sequence[Change] = (),
    environ: Mapping[str, str] | None = None,
    redact: Redactor | None = None,
    deployment_error: Mapping[str, str] | None = None,
    request: FixedRequest | None = None,
) -> dict[str, Any]:
    """The sealed fingerprint of this host and `target`; every part that cannot be read says why."""
    redact = redact or redactor()
    view = nvml.read()
    image: dict[str, Any] | None = None
    if isinstance(target, ImageTarget):
        image, runtime = _image_parts(target.ref, gpus=view.available and bool(view.gpus), redact=redact)
    elif isinstance(target, PythonTarget):
        runtime = run_python_probe(target.path, dict(target.env))
    else:
        runtime = runtime_section("none", None, "no image or Python given to probe")
    document = {
        "schema": SCHEMA,
        "captured_at": WALL.stamp("seconds"),
        "host": host_facts(),
        "nvml": view.to_json(),
        "image": image,
        "runtime": runtime,
        "env": relevant_env(os.environ if environ is None else environ, redact),
        # each cache vLLM and its libraries keep on this host (kernel/data/caches.toml): where, how much, an index hash
        "caches": caches_section(
            os.environ if environ is None else environ, redact, image=isinstance(target, ImageTarget)
        ),
        "launch": {"argv": redact.argv(list(argv))},
        "request": request.section(redact) if request else None,
        "changes": [{"at": c.at, "what": redact.line(c.what), "by": c.by} for c in changes],
        # the first error in the failing deployment's own log, when one was given
        "deployment_error": {k: redact.line(v) for k, v in deployment_error.items()} if deployment_error else None,
    }
    return seal(document)


def _image_parts(ref: str, *, gpus: bool, redact: Redactor) -> tuple[dict[str, Any], dict[str, Any]]:
    try:
        client = docker_client()
    except DockerUnavailable as exc:
        return unavailable_image(ref, str(exc)), runtime_section("image", None, str(exc))
    try:
        image = inspect_image(client, ref, redact)
        if image["id"] is None:
            return image, runtime_section("image", None, image["error"])
        return image, probe_image(client, ref, gpus=gpus)
    finally:
        client.close()
