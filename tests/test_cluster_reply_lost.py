"""Scale-out: when a table's owner made a forwarded request durable and failed before answering, the member that
forwarded it finds the request's receipt and raises AppliedReplyLost. The change is known applied, so each catalog
rebuilds its answer from the store instead of answering "state unknown" (a 5xx).

The owner's failure is simulated at the registry: the request is really applied by the real actor, then its answer
is replaced by AppliedReplyLost, as coordinator/cluster/routing.py does once it has seen the receipt."""

from __future__ import annotations

import pytest

from coordinator.errors import AppliedReplyLost
from coordinator.iceberg import parse_requirements, parse_updates
from coordinator.iceberg.state import TableIdent

from tests.lance.conftest import coord, stage  # noqa: F401  (coord: the in-process coordinator fixture)
from tests.lance.test_lance_transactions import create


@pytest.fixture
def answers_lost(coord, monkeypatch):
    """The next submit applies, then loses its answer; later ones (the catalog's read-back) are answered."""
    submit = coord.registry.submit

    async def applied_then_lost(table_id, proposal):
        monkeypatch.setattr(coord.registry, "submit", submit)
        await submit(table_id, proposal)
        raise AppliedReplyLost("the owner applied the request but failed before answering")
    return lambda: monkeypatch.setattr(coord.registry, "submit", applied_then_lost)


async def test_lance_version_create_answers_with_the_applied_version(coord, answers_lost):
    t = await coord.lance.declare_table(("t",), None, None)
    answers_lost()
    version = await coord.lance.create_table_version(("t",), create(1, stage(t.location, 1)))
    staged = stage(t.location, 2)
    answers_lost()
    again = await coord.lance.create_table_version(("t",), create(2, staged))
    assert (version.version, again.version) == (1, 2)
    assert again.staging_uri.endswith(staged.rsplit("/", 1)[-1])  # this very commit's record
    assert again.manifest_uri.endswith(".manifest")


async def test_iceberg_commit_answers_with_the_table_including_the_commit(coord, answers_lost):
    schema = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "a", "type": "long",
                                                            "required": False}]}
    await coord.iceberg.create_namespace("", ("db",), {})
    ident = TableIdent("", ("db",), "t")
    await coord.iceberg.create_table(ident, schema=schema, location=None, partition_spec=None, write_order=None,
                                     properties={}, stage_create=False)
    answers_lost()
    table = await coord.iceberg.commit_table(ident, parse_requirements([]), parse_updates(
        [{"action": "set-properties", "updates": {"k": "v"}}]))
    assert table.metadata["properties"]["k"] == "v"
    assert table.metadata_location.split("/")[-1].startswith("00001-")
