"""Shared pieces of the Lance suites: clients of the running service, and staged manifests."""

from __future__ import annotations

import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from coordinator.service import Coordinator
from coordinator.lance.layout import manifest_name, object_path



def fake_manifest() -> bytes:
    """Unique bytes ending in Lance's manifest magic: enough for the server's checks in tests that stage their
    own manifests (two writers' manifests always differ)."""
    return b"fake manifest " + uuid.uuid4().bytes + b"LANC"


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service, timeout=60) as client:
        yield client


@pytest.fixture
def rest(service):
    """The spec's generated client (lance_namespace_urllib3_client), for operations pylance does not expose."""
    from lance_namespace_urllib3_client import ApiClient, Configuration
    with ApiClient(Configuration(host=service)) as client:
        yield client


@asynccontextmanager
async def coordinator_in_process(config, nursery):
    """A coordinator running in this process (no HTTP), stopped with the test's nursery."""
    c = Coordinator(config)
    await trio.to_thread.run_sync(c.open)
    await nursery.start(c.run)
    try:
        yield c
    finally:
        nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(c.close)


@pytest.fixture
async def coord(config, nursery):
    """The coordinator in-process (no HTTP), for tests about actors and transactions."""
    async with coordinator_in_process(config, nursery) as c:
        yield c


def stage(location: str, version: int, data: bytes | None = None, scheme: str = "V2") -> str:
    """Write a staged manifest the way Lance does (`_versions/<final name>-<uuid>`); returns its object-store path."""
    from storage.files import to_local_path
    directory = to_local_path(location) / "_versions"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{manifest_name(version, scheme)}-{uuid.uuid4()}"
    path.write_bytes(fake_manifest() if data is None else data)
    return object_path(path.as_uri())


def local(object_store_path: str) -> Path:
    return Path("/" + object_store_path)
