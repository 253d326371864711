"""A Lance writer's staged manifest, written without fsync (as Lance's local writer does), survives a power loss
that comes after its version is recorded and before the service renames it into place: the service made it
durable before recording the version, so it restores the final manifest from it on restart."""

from __future__ import annotations

import httpx
import pytest

from tests.chaos_power import PowerLoss, skip_reason
from tests.lance.conftest import fake_manifest, stage
from tests.support import ServerProcess

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def power():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    rig = PowerLoss()
    yield rig
    rig.close()


def test_unsynced_staged_manifest_survives_a_power_loss_before_publish(power, tmp_path):
    server = ServerProcess(power.dsn, tmp_path / "server", warehouse=power.warehouse)
    base = server.start()
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.post("/v1/namespace/pl/create", json={}).status_code == 200
            r = http.post("/v1/table/pl$t/declare", json={})
            assert r.status_code == 200, r.text
            location = r.json()["location"]
        server.kill()
        # Dies right after the version is recorded, before its final manifest is in place.
        server.extra_env = {"COORDINATOR_CRASH_POINTS": "before-publish:1"}
        server.start()
        manifest = fake_manifest()
        staged = stage(location, 1, manifest)   # a plain write, no fsync
        with httpx.Client(base_url=base, timeout=30) as http:
            try:
                r = http.post("/v1/table/pl$t/version/create", json={"version": 1, "manifest_path": staged})
                pytest.fail(f"answered {r.status_code} {r.text}: the crash point did not fire")
            except httpx.TransportError:
                pass   # the service died at the crash point
        server.proc.wait(30)
        power.cut()                                 # every byte nobody fsynced is gone
        server.extra_env = {}
        server.start()
        with httpx.Client(base_url=base, timeout=30) as http:
            r = http.post("/v1/table/pl$t/version/list", params={"limit": 10})
            assert r.status_code == 200, r.text
            versions = r.json()["versions"]
        assert [v["version"] for v in versions] == [1], versions   # recorded before the cut: it stays
        with open("/" + versions[0]["manifest_path"], "rb") as f:   # (an object-store path: no leading /)
            assert f.read() == manifest
    finally:
        server.stop()
