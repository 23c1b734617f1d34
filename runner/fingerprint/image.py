"""The image through the docker SDK: inspect (no pull, read-only) and the probe in a short-lived container."""

from __future__ import annotations

import contextlib
from typing import Any

from kernel.images import is_pinned
from kernel.redact import Redactor
from runner.fingerprint.probe import PROBE_TIMEOUT_S, probe_script, runtime_section

PROBE_LABEL = "k3repro.probe"  # marks probe containers, so leftovers can be found and removed


class DockerUnavailable(Exception):
    """No usable docker engine; the message says why."""


def docker_client() -> Any:
    """A client for $DOCKER_HOST (or the default socket) that answered a ping. The SDK is imported here, not
    at module load, so commands that never touch Docker do not pay for it."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except DockerException as exc:
        raise DockerUnavailable(f"docker engine unreachable: {exc}") from None
    return client


def gpu_device_requests() -> list[Any]:
    """The GPU request of a launch (`--gpus all`): the probe container asks for exactly the same."""
    from docker.types import DeviceRequest

    return [DeviceRequest(count=-1, capabilities=[["gpu"]])]


def unavailable_image(ref: str, reason: str) -> dict[str, Any]:
    return {
        "ref": ref,
        "id": None,
        "repo_digests": None,
        "repo_tags": None,
        "pinned": is_pinned(ref),
        "created": None,
        "env": None,
        "labels": None,
        "error": reason,
    }


def inspect_image(client: Any, ref: str, redact: Redactor) -> dict[str, Any]:
    """What `docker image inspect` says; a missing image is reported, never pulled (freeze is read-only)."""
    from docker.errors import DockerException, ImageNotFound

    try:
        data = client.api.inspect_image(ref)
    except ImageNotFound:
        return unavailable_image(ref, f"image {ref} is not on this host (not pulled)")
    except DockerException as exc:
        return unavailable_image(ref, f"docker image inspect failed: {exc}")
    config = data.get("Config") or {}
    env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
    return {
        "ref": ref,
        "id": data.get("Id"),
        "repo_digests": sorted(data.get("RepoDigests") or []),
        "repo_tags": sorted(data.get("RepoTags") or []),
        "pinned": is_pinned(ref),
        "created": data.get("Created"),
        "env": redact.env(env),
        "labels": {k: redact.line(v) for k, v in (config.get("Labels") or {}).items()},
        "error": None,
    }


def probe_options(gpus: bool) -> dict[str, Any]:
    """How the probe container is created: no network, our label, and the launch's GPU request when the
    host has GPUs (without NVML there is nothing to request, and docker would refuse the request)."""
    options: dict[str, Any] = {
        "entrypoint": ["/bin/sh", "-c"],
        "command": [probe_script()],
        "network_mode": "none",
        "labels": {PROBE_LABEL: "1"},
    }
    if gpus:
        options["device_requests"] = gpu_device_requests()
    return options


def probe_image(client: Any, ref: str, *, gpus: bool) -> dict[str, Any]:
    """Runs the probe in a short-lived container of `ref`; the container is always removed."""
    from docker.errors import DockerException
    from requests.exceptions import RequestException

    container = None
    try:
        container = client.containers.create(ref, **probe_options(gpus))
        container.start()
        status = container.wait(timeout=PROBE_TIMEOUT_S)
        output = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
    except (DockerException, RequestException) as exc:
        return runtime_section("image", None, f"probe container failed: {_one_line(exc)}")
    finally:
        if container is not None:
            with contextlib.suppress(DockerException, RequestException):
                container.remove(force=True)
    code = status.get("StatusCode", 0)
    error = None if code == 0 else f"probe exited {code} (the image has no POSIX /bin/sh?)"
    return runtime_section("image", output, error)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
