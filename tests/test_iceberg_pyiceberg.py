"""End to end with pyiceberg's RestCatalog over real HTTP against the running service."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog
from pyiceberg.exceptions import (CommitFailedException, NamespaceAlreadyExistsError, NamespaceNotEmptyError,
                                  NoSuchNamespaceError, NoSuchTableError, TableAlreadyExistsError)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestampType

from storage.files import to_local_path


@pytest.fixture
def catalog(service):
    return load_catalog("coord", type="rest", uri=service)


SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "category", StringType(), required=False),
    NestedField(3, "ts", TimestampType(), required=False),
)


def batch(start: int, n: int) -> pa.Table:
    import datetime as dt
    base = dt.datetime(2026, 1, 1)
    return pa.table({
        "id": pa.array(range(start, start + n), pa.int64()),
        "category": pa.array([f"c{i % 3}" for i in range(start, start + n)], pa.string()),
        "ts": pa.array([base + dt.timedelta(hours=i) for i in range(start, start + n)], pa.timestamp("us")),
    })


def test_namespaces(catalog):
    catalog.create_namespace("sales", {"owner": "ana"})
    catalog.create_namespace(("sales", "eu"))
    with pytest.raises(NamespaceAlreadyExistsError):
        catalog.create_namespace("sales")
    assert ("sales",) in catalog.list_namespaces()
    assert catalog.list_namespaces("sales") == [("sales", "eu")]
    assert catalog.load_namespace_properties("sales") == {"owner": "ana"}
    summary = catalog.update_namespace_properties("sales", removals={"owner", "nope"}, updates={"tier": "gold"})
    assert summary.removed == ["owner"] and summary.updated == ["tier"] and summary.missing == ["nope"]
    assert catalog.load_namespace_properties("sales") == {"tier": "gold"}
    # Nothing missing: pyiceberg requires the (empty) list all the same.
    summary = catalog.update_namespace_properties("sales", updates={"tier": "silver"})
    assert summary.updated == ["tier"] and summary.removed == [] and summary.missing == []
    with pytest.raises(NamespaceNotEmptyError):
        catalog.drop_namespace("sales")
    catalog.drop_namespace(("sales", "eu"))
    catalog.drop_namespace("sales")
    with pytest.raises(NoSuchNamespaceError):
        catalog.load_namespace_properties("sales")


def test_table_lifecycle_appends_and_evolution(catalog):
    catalog.create_namespace("db")
    spec = PartitionSpec(PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="category"))
    table = catalog.create_table("db.events", schema=SCHEMA, partition_spec=spec)
    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table("db.events", schema=SCHEMA)
    assert catalog.table_exists("db.events")
    assert catalog.list_tables("db") == [("db", "events")]

    for i in range(20):
        table.append(batch(i * 10, 10))
    table = catalog.load_table("db.events")
    assert len(table.metadata.snapshots) == 20
    assert table.scan().to_arrow().num_rows == 200
    assert table.metadata_location.endswith(".metadata.json")
    assert len(table.metadata.metadata_log) == 20

    # Schema evolution: a new optional column, then more data carrying it.
    with table.update_schema() as update:
        update.add_column("note", StringType())
    table = catalog.load_table("db.events")
    assert table.schema().find_field("note").field_id == 4
    data = batch(1000, 5).append_column("note", pa.array(["x"] * 5, pa.string()))
    table.append(data)

    # Partition evolution: add a day(ts) partition field.
    with table.update_spec() as update:
        update.add_field("ts", DayTransform(), "ts_day")
    table = catalog.load_table("db.events")
    assert len(table.specs()) == 2
    table.append(batch(2000, 7).append_column("note", pa.array([None] * 7, pa.string())))

    rows = catalog.load_table("db.events").scan().to_arrow()
    assert rows.num_rows == 212
    assert sorted(rows["id"].to_pylist())[:3] == [0, 1, 2]
    assert rows.filter(pa.compute.equal(rows["note"], "x")).num_rows == 5

    catalog.rename_table("db.events", "db.events2")
    with pytest.raises(NoSuchTableError):
        catalog.load_table("db.events")
    assert catalog.load_table("db.events2").scan().to_arrow().num_rows == 212
    catalog.drop_table("db.events2")
    assert not catalog.table_exists("db.events2")


def test_concurrent_appends_lose_nothing(catalog):
    catalog.create_namespace("db")
    catalog.create_table("db.hot", schema=SCHEMA)
    acknowledged = []
    errors = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        try:
            for i in range(4):
                while True:
                    table = catalog.load_table("db.hot")
                    try:
                        table.append(batch(w * 1000 + i * 10, 3))
                        break
                    except CommitFailedException:
                        continue
                with lock:
                    acknowledged.append((w, i))
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    table = catalog.load_table("db.hot")
    assert len(acknowledged) == 32
    assert table.scan().to_arrow().num_rows == 3 * len(acknowledged)
    assert len(table.metadata.snapshots) == len(acknowledged)


def test_create_table_transaction_uses_stage_create_and_assert_create(catalog):
    """pyiceberg's create transaction: stage-create, then a commit with `assert-create` carrying every update."""
    catalog.create_namespace("db")
    with catalog.create_table_transaction("db.staged", schema=SCHEMA, properties={"owner": "ana"}) as tx:
        tx.append(batch(0, 4))
        assert not catalog.table_exists("db.staged"), "a staged table must not exist before its commit"
    table = catalog.load_table("db.staged")
    assert table.properties["owner"] == "ana"
    assert table.scan().to_arrow().num_rows == 4
    # A second create transaction for the same name fails its assert-create.
    with pytest.raises((CommitFailedException, TableAlreadyExistsError)):
        with catalog.create_table_transaction("db.staged", schema=SCHEMA) as tx:
            tx.append(batch(10, 1))
    assert catalog.load_table("db.staged").scan().to_arrow().num_rows == 4


def _eventually(check, what: str) -> None:
    """The purge runs once the drop is durable, after the answer."""
    for _ in range(200):
        if check():
            return
        time.sleep(0.025)
    raise AssertionError(what)


def test_purge_deletes_the_tables_data_and_metadata(catalog):
    """`purgeRequested`: "purge the underlying table's data and metadata" (pyiceberg's purge_table relies on the
    server for it). With `gc.enabled=false` (files may be shared with another table) data files stay, as in Java's
    CatalogUtil.dropTableData, and what only the table's metadata names goes."""
    catalog.create_namespace("pg")
    purged = catalog.create_table("pg.purged", SCHEMA)
    shared = catalog.create_table("pg.shared", SCHEMA, properties={"gc.enabled": "false"})
    neighbour = catalog.create_table("pg.neighbour", SCHEMA)
    for table in (purged, shared, neighbour):
        for i in range(3):
            table.append(batch(i * 10, 10))
    purged_dir, shared_dir, neighbour_dir = (to_local_path(t.location()) for t in (purged, shared, neighbour))
    assert len(list(purged_dir.rglob("*.parquet"))) == 3

    catalog.purge_table("pg.purged")
    _eventually(lambda: not purged_dir.exists(), f"{purged_dir} still exists")

    catalog.purge_table("pg.shared")
    _eventually(lambda: not list(shared_dir.rglob("*.metadata.json")), "metadata files still exist")
    assert len(list(shared_dir.rglob("*.parquet"))) == 3
    assert not list(shared_dir.rglob("snap-*.avro"))  # manifest lists

    # The neighbour is untouched and still reads all its rows.
    assert len(list(neighbour_dir.rglob("*.parquet"))) == 3
    assert catalog.load_table("pg.neighbour").scan().to_arrow().num_rows == 30


def _files_under(directory) -> set:
    return {p for p in directory.rglob("*") if p.is_file()}


def test_a_purge_where_other_tables_files_lie_deletes_only_its_own(catalog, service):
    """A location the client chose may hold files the purged table never wrote: those of a table that moved away
    with `set-location` (still live, still reading them) and of one dropped without purge (kept, to be registered
    again). Such a purge deletes the files its metadata reaches, as Java's CatalogUtil.dropTableData, and nothing
    else; the directories it empties go too."""
    import httpx

    catalog.create_namespace("shared")
    moved = catalog.create_table("shared.moved", SCHEMA)
    moved.append(batch(0, 10))
    first_place = moved.location()
    moved_files = _files_under(to_local_path(first_place))
    r = httpx.post(f"{service}/v1/namespaces/shared/tables/moved", json={   # Spark's ALTER TABLE ... SET LOCATION
        "requirements": [{"type": "assert-table-uuid", "uuid": str(moved.metadata.table_uuid)}],
        "updates": [{"action": "set-location", "location": first_place + "-moved"}]})
    assert r.status_code == 200, r.text
    kept = catalog.create_table("shared.kept", SCHEMA)
    kept.append(batch(0, 5))
    kept_metadata, kept_place = kept.metadata_location, kept.location()
    kept_files = _files_under(to_local_path(kept_place))
    catalog.drop_table("shared.kept")   # no purge: the files stay

    for place, others in ((first_place, moved_files), (kept_place, kept_files)):
        newcomer = catalog.create_table("shared.newcomer", SCHEMA, location=place)
        newcomer.append(batch(100, 10))
        newcomer.append(batch(200, 10))
        own = _files_under(to_local_path(place)) - others
        assert len([p for p in own if p.suffix == ".parquet"]) == 2
        catalog.purge_table("shared.newcomer")
        _eventually(lambda own=own: not any(p.exists() for p in own), f"the purged table's files in {place} remain")
        assert all(p.exists() for p in others), place
        assert not any(d.is_dir() and not any(d.iterdir()) for d in to_local_path(place).rglob("*"))
    assert catalog.load_table("shared.moved").scan().to_arrow().num_rows == 10
    assert catalog.register_table("shared.kept", kept_metadata).scan().to_arrow().num_rows == 5


def test_only_a_table_that_never_left_its_given_directory_is_purged_whole(catalog, service):
    """A table in the directory the service gave it is purged whole (orphans too). Once moved, even back, its
    place may hold files that are not its own, and only what its metadata reaches is deleted. So is a table
    created by a create transaction that named its location, even the one a stage-create handed out."""
    import httpx

    catalog.create_namespace("own")
    stays = catalog.create_table("own.stays", SCHEMA)
    stays.append(batch(0, 5))
    orphan = to_local_path(stays.location()) / "data" / "orphan-of-a-failed-write.parquet"
    orphan.write_bytes(b"x")
    catalog.purge_table("own.stays")
    _eventually(lambda: not to_local_path(stays.location()).exists(), "the given directory was not removed whole")

    moves = catalog.create_table("own.moves", SCHEMA)
    moves.append(batch(0, 5))
    home = moves.location()
    for place in (home + "-away", home):   # away and back
        r = httpx.post(f"{service}/v1/namespaces/own/tables/moves", json={"requirements": [], "updates": [
            {"action": "set-location", "location": place}]})
        assert r.status_code == 200, r.text
    foreign = to_local_path(home) / "data" / "left-by-another-table.parquet"
    foreign.write_bytes(b"x")
    own = _files_under(to_local_path(home)) - {foreign}
    catalog.purge_table("own.moves")
    _eventually(lambda: not any(p.exists() for p in own), "the moved table's files remain")
    assert foreign.exists()

    staged = catalog.create_table_transaction("own.staged", SCHEMA)   # stage-create, then assert-create
    staged.commit_transaction()
    table = catalog.load_table("own.staged")
    table.append(batch(0, 5))
    foreign = to_local_path(table.location()) / "data" / "left-by-another-table.parquet"
    foreign.write_bytes(b"x")
    own = _files_under(to_local_path(table.location())) - {foreign}
    catalog.purge_table("own.staged")
    _eventually(lambda: not any(p.exists() for p in own), "the staged table's files remain")
    assert foreign.exists()


def test_a_create_transaction_with_a_dropped_tables_uuid_does_not_own_its_files(catalog, service):
    """A create transaction may assign its own table-uuid: that of a table of the same name dropped without purge,
    whose files stay in the directory named after it. The new table's directory is named after a uuid the
    service generates, so its whole-tree purge never reaches the kept files."""
    import httpx

    catalog.create_namespace("reuse")
    old = catalog.create_table("reuse.t", SCHEMA)
    old.append(batch(0, 5))
    old_uuid, old_place = str(old.metadata.table_uuid), to_local_path(old.location())
    kept = _files_under(old_place)
    old_metadata = old.metadata_location
    catalog.drop_table("reuse.t")          # without purge: the files are the user's, to register again later
    assert all(p.exists() for p in kept)

    updates = [{"action": "assign-uuid", "uuid": old_uuid},
               {"action": "upgrade-format-version", "format-version": 2},
               {"action": "add-schema", "schema": {"type": "struct", "schema-id": 0, "fields": [
                   {"id": 1, "name": "id", "type": "long", "required": False}]}},
               {"action": "set-current-schema", "schema-id": -1},
               {"action": "add-spec", "spec": {"spec-id": 0, "fields": []}},
               {"action": "set-default-spec", "spec-id": -1},
               {"action": "add-sort-order", "sort-order": {"order-id": 0, "fields": []}},
               {"action": "set-default-sort-order", "sort-order-id": -1}]
    r = httpx.post(f"{service}/v1/namespaces/reuse/tables/t",
                   json={"requirements": [{"type": "assert-create"}], "updates": updates})
    assert r.status_code == 200, r.text
    assert to_local_path(r.json()["metadata"]["location"]) != old_place   # a directory of its own
    catalog.purge_table("reuse.t")
    time.sleep(1)
    gone = [p for p in kept if not p.exists()]
    assert not gone, f"the purge deleted {len(gone)} files of the table dropped without purge, e.g. {gone[:2]}"
    assert catalog.register_table("reuse.back", old_metadata).scan().to_arrow().num_rows == 5


def test_an_existing_name_is_409_even_when_its_location_is_given_again(catalog):
    """Spec, createTable and registerTable: 409 "The table already exists". A create run twice with an explicit
    location, or a register of a table's own metadata under its name, names a location that is taken too; the
    name comes first, so pyiceberg's create_table_if_not_exists can fall back to loading the table."""
    catalog.create_namespace("again")
    schema = Schema(NestedField(1, "id", LongType(), required=False))
    first = catalog.create_table("again.t", schema=schema)
    location = first.location().rsplit("/", 1)[0] + "/fixed"
    fixed = catalog.create_table("again.fixed", schema=schema, location=location)
    with pytest.raises(TableAlreadyExistsError):
        catalog.create_table("again.fixed", schema=schema, location=location)
    assert catalog.create_table_if_not_exists("again.fixed", schema=schema, location=location).metadata_location \
        == fixed.metadata_location
    with pytest.raises(TableAlreadyExistsError):
        catalog.register_table("again.t", first.metadata_location)
