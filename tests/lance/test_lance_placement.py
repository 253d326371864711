"""Where a Lance table may be placed: not in, or above, a namespace's directory (Lance's, or an unprefixed Iceberg
namespace's: they share the warehouse), however its name is spelled on disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from coordinator.purges import Resumer

from coordinator.errors import BadRequest
from storage.files import local_path, path_segment

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
    from coordinator.iceberg.state import TableIdent
    await coord.iceberg.create_namespace("", ("db",), {})
    await coord.lance.create_namespace(("x",), None, None)
    with pytest.raises(BadRequest):
        await coord.lance.declare_table(("x", "t"), f"{coord.config.warehouse_uri}/db", None)
    await coord.iceberg.create_table(TableIdent("", ("db",), "t"), schema=SCHEMA, location=None,
                                     partition_spec=None, write_order=None, properties={}, stage_create=False)


async def test_a_lance_location_on_a_prefixed_iceberg_catalogs_directory(coord):
    """A prefixed Iceberg catalog's namespaces live under `<warehouse>/<prefix>~`: no Lance table there."""
    from coordinator.iceberg.state import TableIdent
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

def _final_manifest(location: str, version: int) -> None:
    """A final manifest, as a Lance writer leaves it."""
    from coordinator.lance.layout import manifest_name

    from .conftest import fake_manifest
    d = Path(local_path(location)) / "_versions"
    d.mkdir(parents=True, exist_ok=True)
    (d / manifest_name(version, "V2")).write_bytes(fake_manifest())


async def test_a_link_between_the_warehouse_and_a_location_stops_its_purge(coord, tmp_path):
    """A client plants <wh>/a/evil -> <outside> and registers a Lance table at <wh>/a/evil/sales: its key is
    below the warehouse, in namespace a. Its drop deletes nothing (a leak, logged), not <outside>/sales."""
    lance = coord.lance
    await lance.create_namespace(("a",), None, None)
    outside = tmp_path / "outside"
    _final_manifest((outside / "sales").as_uri(), 1)
    (outside / "sales" / "precious.bin").write_bytes(b"x")
    wh = Path(local_path(coord.config.warehouse_uri))
    (wh / "a").mkdir(parents=True, exist_ok=True)
    os.symlink(outside, wh / "a" / "evil")
    await lance.register_table(("a", "t"), f"{coord.config.warehouse_uri}/a/evil/sales", None, None)
    await lance.drop_table(("a", "t"))
    await trio.sleep(0.5)
    assert (outside / "sales" / "precious.bin").exists(), "a drop deleted a directory outside the warehouse"


async def test_a_drop_where_another_table_lives_ends_its_claim_and_deletes_nothing_later(coord, monkeypatch):
    """Two Lance rows at one place (a row from before locations were exclusive: made here by editing the key).
    Dropping A deletes nothing, B living there, and ends its claim: B, deregistered later, keeps its files (a
    claim left for a later pass would have deleted them)."""
    lance, store = coord.lance, coord.store
    await lance.create_namespace(("db",), None, None)
    a = await lance.declare_table(("db", "a"), None, None)
    place = a.location
    _final_manifest(place, 1)
    # B: a legacy row registered at the same place (its key differs until we put it back).
    b_loc = place + "x"
    os.makedirs(local_path(b_loc), exist_ok=True)
    _final_manifest(b_loc, 1)
    await lance.register_table(("db", "b"), b_loc, None, None)
    ref = await store.find_table("lance", "", "db", "b")
    await store._call(lambda con: con.execute("UPDATE tables SET location=$2, location_key=$3 WHERE table_id=$1",
                                              ref.table_id, place, "file:" + os.path.normpath(local_path(place))))
    lance.names.forget(("db", "b"))   # (its cached location is stale)
    await lance.drop_table(("db", "a"))
    await trio.sleep(0.5)
    assert os.path.exists(local_path(place) + "/_versions"), "deleted while B lives"
    assert not await store.pending_purges(), "A's claim was left"
    await lance.deregister_table(("db", "b"))      # B's files are the user's now: they must stay
    resumer = Resumer(coord.store, coord.files, cluster=False)
    taken, at = await resumer._take_over_purges(0)
    await resumer._resume(taken, at)
    assert os.path.exists(local_path(place) + "/_versions"), "a deregistered table's files were deleted"


async def test_a_reload_deletes_no_manifests_through_a_link(coord, tmp_path):
    """A table's place swapped for a link to another dataset after it was declared: a reload's clean-up of
    unrecorded final manifests finds that dataset's manifests and must leave them."""
    from coordinator.errors import CoordinatorError
    from coordinator.lance.models import CreateTableVersionRequest
    from coordinator.lance.layout import manifest_uri
    from storage.files import to_local_path

    from .conftest import fake_manifest, stage

    lance = coord.lance
    await lance.create_namespace(("a",), None, None)
    wh = Path(local_path(coord.config.warehouse_uri))
    (wh / "a" / "evil").mkdir(parents=True)
    t = await lance.declare_table(("a", "t"), f"{coord.config.warehouse_uri}/a/evil/sales", None)
    # The victim: a Lance dataset outside the warehouse, versions 1..3, written long ago.
    outside = tmp_path / "outside"
    victims = [to_local_path(manifest_uri((outside / "sales").as_uri(), v, "V2")) for v in (1, 2, 3)]
    victims[0].parent.mkdir(parents=True)
    for p in victims:
        p.write_bytes(fake_manifest())
        os.utime(p, (1, 1))
    # The client swaps its directory for a link.
    os.rename(wh / "a" / "evil", wh / "a" / "evil.old")
    os.symlink(outside, wh / "a" / "evil")
    coord.registry.actors[await lance.names.id(("a", "t"))].unload()   # as after a refused write
    with pytest.raises(CoordinatorError):   # version 9 is not the next: refused, after the reload
        await lance.create_table_version(("a", "t"),
                                         CreateTableVersionRequest(version=9, manifest_path=stage(t.location, 9)))
    assert all(p.exists() for p in victims), "a reload deleted another dataset's manifests through a link"


async def test_a_reload_deletes_no_manifests_through_a_versions_link(coord, tmp_path):
    """The same with the table's `_versions/` itself swapped for a link to another dataset's: deletions below a
    table's place go through directory descriptors and follow no link, whichever directory it is."""
    from coordinator.errors import CoordinatorError
    from coordinator.lance.models import CreateTableVersionRequest
    from coordinator.lance.layout import manifest_uri
    from storage.files import to_local_path

    from .conftest import fake_manifest, stage

    lance = coord.lance
    await lance.create_namespace(("a",), None, None)
    t = await lance.declare_table(("a", "t"), None, None)
    outside = tmp_path / "outside" / "sales"
    victims = [to_local_path(manifest_uri(outside.as_uri(), v, "V2")) for v in (1, 2, 3)]
    victims[0].parent.mkdir(parents=True)
    for p in victims:
        p.write_bytes(fake_manifest())
        os.utime(p, (1, 1))
    versions = Path(local_path(t.location)) / "_versions"
    versions.mkdir(parents=True, exist_ok=True)
    os.rename(versions, versions.with_name("_versions.old"))
    os.symlink(victims[0].parent, versions)
    coord.registry.actors[await lance.names.id(("a", "t"))].unload()   # as after a refused write
    with pytest.raises(CoordinatorError):
        await lance.create_table_version(("a", "t"),
                                         CreateTableVersionRequest(version=9, manifest_path=stage(t.location, 9)))
    assert all(p.exists() for p in victims), "a reload deleted another dataset's manifests through a link"


async def test_no_link_below_a_table_hands_its_commit_another_datasets_files(coord):
    """A commit reads its staged manifest, and writes its final one, from within the table's place following no
    link: a staged name that is a link to another dataset's manifest is refused (its bytes are not copied in),
    and a `_versions/` linked to another dataset's is written nowhere, however the place is spelled (a decoded
    location that looks percent-encoded once checked the place as text and fell back to plain paths)."""
    from coordinator.errors import BadRequest
    from coordinator.lance.models import CreateTableVersionRequest
    from coordinator.lance.layout import manifest_uri, object_path
    from storage.files import to_local_path

    from .conftest import fake_manifest, stage

    def create(version, path):
        return CreateTableVersionRequest(version=version, manifest_path=path)

    lance = coord.lance
    victim = await lance.declare_table(("victim",), None, None)
    committed = fake_manifest()
    await lance.create_table_version(("victim",), create(1, stage(victim.location, 1, committed)))
    victim_final = to_local_path(manifest_uri(victim.location, 1, "V2"))

    a = await lance.declare_table(("a",), None, None)
    (to_local_path(a.location) / "_versions").mkdir(parents=True, exist_ok=True)
    link = to_local_path(a.location) / "_versions" / "1.manifest-evil"
    os.symlink(victim_final, link)
    with pytest.raises(BadRequest, match="link"):
        await lance.create_table_version(("a",), create(1, object_path(link.as_uri())))
    assert not to_local_path(manifest_uri(a.location, 1, "V2")).exists()

    b = await lance.declare_table(("b",), "file://" + coord.config.warehouse + "/b%252e", None)
    place = to_local_path(b.location)
    place.mkdir(parents=True)
    os.symlink(victim_final.parent, place / "_versions")
    with pytest.raises(BadRequest, match="link"):   # (its staged manifest lies behind the link)
        await lance.create_table_version(("b",), create(1, stage(b.location, 1, fake_manifest())))
    with pytest.raises(OSError):   # and were it read, its final manifest would be written nowhere
        await coord.files.write_many([(manifest_uri(b.location, 1, "V2"), fake_manifest(), None, b.location)])
    assert victim_final.read_bytes() == committed


async def test_a_staged_name_too_long_for_the_file_system_is_a_bad_request(coord):
    from coordinator.errors import BadRequest
    from coordinator.lance.models import CreateTableVersionRequest
    from storage.files import to_local_path

    t = await coord.lance.declare_table(("long",), None, None)
    (to_local_path(t.location) / "_versions").mkdir(parents=True, exist_ok=True)
    path = str(to_local_path(t.location) / "_versions" / ("1.manifest-" + "x" * 300)).lstrip("/")
    with pytest.raises(BadRequest, match="too long"):
        await coord.lance.create_table_version(("long",), CreateTableVersionRequest(version=1, manifest_path=path))
