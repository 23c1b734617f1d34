"""A read-only registry on 127.0.0.1 serving images saved from the test's dockerd, so `docker pull` gives an image
the registry digest (RepoDigests) a real deployment's image has. Docker speaks plain HTTP to 127.0.0.0/8.

Only what a pull asks: GET /v2/, the manifest of a tag or digest (Docker schema 2), blobs by digest.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Registry:
    port: int
    blobs: dict[str, bytes] = field(default_factory=dict)
    manifests: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (repository, tag or digest) -> manifest

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def publish(self, client: Any, local_ref: str, repository: str, tag: str) -> str:
        """Serves the local image `local_ref` as `repository:tag`; returns its manifest digest."""
        saved = b"".join(client.images.get(local_ref).save())
        with tarfile.open(fileobj=io.BytesIO(saved)) as tar:
            (entry,) = json.loads(_read(tar, "manifest.json"))
            config = _read(tar, entry["Config"])
            layers = [gzip.compress(_read(tar, name), mtime=0) for name in entry["Layers"]]
        for blob in (config, *layers):
            self.blobs[_digest(blob)] = blob
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": {
                    "mediaType": "application/vnd.docker.container.image.v1+json",
                    "size": len(config),
                    "digest": _digest(config),
                },
                "layers": [
                    {
                        "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                        "size": len(b),
                        "digest": _digest(b),
                    }
                    for b in layers
                ],
            }
        ).encode()
        digest = _digest(manifest)
        self.manifests[(repository, tag)] = self.manifests[(repository, digest)] = manifest
        return digest


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    assert member is not None, name
    return member.read()


@contextmanager
def running_registry() -> Iterator[Registry]:
    registry = Registry(0)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            return None

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, *, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            data, kind = None, "application/octet-stream"
            if path == "/v2/":
                data, kind = b"{}", "application/json"
            elif "/manifests/" in path:
                repository, reference = path.removeprefix("/v2/").split("/manifests/", 1)
                data, kind = registry.manifests.get((repository, reference)), MANIFEST
            elif "/blobs/" in path:
                data = registry.blobs.get(path.rsplit("/blobs/", 1)[1])
            if data is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Docker-Content-Digest", _digest(data))
            self.send_header("Docker-Distribution-API-Version", "registry/2.0")
            self.end_headers()
            if body:
                self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    registry.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
