from __future__ import annotations

from pathlib import Path

import pytest

from runner.tls import DevCerts, write_dev_certs


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> DevCerts:
    return write_dev_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def other_certs(tmp_path: Path) -> DevCerts:
    """Certificates from a different CA than `certs`."""
    return write_dev_certs(tmp_path / "other-ca")
