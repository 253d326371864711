"""A real S3 server for the session: moto's standalone server on loopback (tests.support.MotoS3)."""

from __future__ import annotations

import pytest

from tests.support import MotoS3


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    with MotoS3(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server) -> str:
    """A fresh, empty bucket on the session's S3 server."""
    return s3_server.bucket()
