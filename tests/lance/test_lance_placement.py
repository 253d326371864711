"""Where a Lance table may be placed: not in, or above, a namespace's directory (Lance's, or an unprefixed Iceberg
namespace's: they share the warehouse), however its name is spelled on disk."""

from __future__ import annotations

import pytest

from coordinator.errors import BadRequest
from storage.files import path_segment

from .conftest import coord  # noqa: F401 - the fixture: the coordinator in process


async def test_a_namespace_with_a_cleaned_directory_name_is_protected_too(coord):
    """`my ns` lives in `my_ns~<hash>`: that directory is found among the children, not taken from its text."""
    lance = coord.lance
    await lance.create_namespace(("my ns",), None, None)
    await lance.create_namespace(("other",), None, None)
    taken = f"{coord.config.warehouse_uri}/{path_segment('my ns')}"
    assert taken == lance.namespace_dir(("my ns",))
    with pytest.raises(BadRequest):
        await lance.declare_table(("other", "squatter"), taken, None)
    await lance.declare_table(("my ns", "t"), None, None)   # a default location, below `taken`


SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "x", "type": "long", "required": False}]}


async def test_a_lance_location_on_an_iceberg_namespaces_directory(coord):
    """Lance and Iceberg share the warehouse and spell namespace directories alike: a Lance table at <wh>/db
    (Lance has no namespace `db`) would leave Iceberg's namespace `db` unable to take a default-located table.
    (The other way, an Iceberg table placed at a Lance namespace's directory, is not checked.)"""
    from coordinator.iceberg.catalog import TableIdent
    await coord.iceberg.create_namespace("", ("db",), {})
    await coord.lance.create_namespace(("x",), None, None)
    with pytest.raises(BadRequest):
        await coord.lance.declare_table(("x", "t"), f"{coord.config.warehouse_uri}/db", None)
    await coord.iceberg.create_table(TableIdent("", ("db",), "t"), schema=SCHEMA, location=None,
                                     partition_spec=None, write_order=None, properties={}, stage_create=False)


async def test_a_lance_location_on_a_prefixed_iceberg_catalogs_directory(coord):
    """A prefixed Iceberg catalog's namespaces live under `<warehouse>/<prefix>~`: no Lance table there."""
    from coordinator.iceberg.catalog import TableIdent
    await coord.iceberg.create_namespace("foo", ("db",), {})
    await coord.lance.create_namespace(("x",), None, None)
    place = coord.iceberg.namespace_dir(TableIdent("foo", ("db",), "t"))
    assert place == f"{coord.config.warehouse_uri}/{path_segment('foo')}~/db"
    with pytest.raises(BadRequest):
        await coord.lance.declare_table(("x", "t"), place, None)


async def test_a_lance_location_on_the_delta_managed_root_blocks_every_managed_delta_table(coord):
    """Nor at Delta's managed root: every staging location is below it, so no Delta managed table could be
    staged again."""
    from coordinator.delta.models import CreateCatalog, CreateSchema, CreateStagingTable
    await coord.lance.create_namespace(("x",), None, None)
    await coord.delta.create_catalog(CreateCatalog(name="c"))
    await coord.delta.create_schema(CreateSchema(name="s", catalog_name="c"))
    with pytest.raises(BadRequest):
        await coord.lance.declare_table(("x", "squatter"), f"{coord.config.warehouse_uri}/__unitystorage", None)
    await coord.delta.create_staging_table(CreateStagingTable(name="t", catalog_name="c", schema_name="s"))
