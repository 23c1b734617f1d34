from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from runner.tls import DevCerts, write_dev_certs
from tests.dockerd import Dockerd, running_dockerd
from tests.slack_api import SlackApi


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return write_dev_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def other_certs(tmp_path: Path) -> DevCerts:
    """Certificates from a different CA than `certs`."""
    return write_dev_certs(tmp_path / "other-ca")


@pytest.fixture(scope="session")
def dockerd() -> Iterator[Dockerd]:
    """One private Docker engine (and its locally built vLLM-like images) for the whole session."""
    with running_dockerd() as engine:
        yield engine


@pytest.fixture
def docker_env(dockerd: Dockerd, monkeypatch: pytest.MonkeyPatch) -> Dockerd:
    """The test's process talks to the private engine, as the runner would through $DOCKER_HOST."""
    monkeypatch.setenv("DOCKER_HOST", dockerd.url)
    return dockerd


@pytest.fixture
async def api() -> AsyncIterator[SlackApi]:
    """A local Slack Web API server on port 0 that records every call (tests/slack_api.py)."""
    server = await SlackApi().start()
    yield server
    await server.stop()
