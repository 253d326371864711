"""Claims on dropped tables' locations (table `purges`, coordinator/registry.py) between members of a cluster."""

from __future__ import annotations

from storage.files import location_key
from tests.lance.conftest import coord  # noqa: F401 - the fixture: the coordinator in process


async def test_only_one_member_takes_over_a_claim_nobody_renewed(coord):
    """Members resuming deletions at once (a rolling restart): exactly one may resume a stale claim; the others
    would outlive it (Registry.resume_purges)."""
    location = f"{coord.config.warehouse_uri}/stale"
    await coord.store.with_connection(lambda con: con.execute(
        "INSERT INTO purges (location_key, location, renewed_at) VALUES ($1, $2, now() - interval '20 minutes')",
        location_key(location), location))
    assert await coord.store.pending_purges(600) == [location]
    taken = [await coord.store.take_over_purge(location, 600) for _ in range(3)]
    assert taken == [True, False, False] and await coord.store.pending_purges(600) == []
