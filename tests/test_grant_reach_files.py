"""A client with a narrow grant reaches no further on the file system (issue 32, items 1, 2 and 4), each attack
driven over HTTP as a hostile client holding a valid grant would, and each checked on the file system or on the
other table afterwards, not only by its status:

1. a Lance writer's `manifest_path` deletes nothing outside its table (no `..%2f`, no link in `_versions`);
2. a Lance-only grant deletes no Iceberg table's files: a declared location holds nothing already, and a drop
   deletes only what its own table wrote (or, at a location the client chose, only Lance's own files);
3. a file a client names is read only if it is a regular file, not through a link, of bounded size, and a read
   that cannot proceed (a FIFO) is a quick 4xx that holds up no other read.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
import trio
from pyiceberg.catalog import load_catalog

from api.server import EmbeddedService
from storage import files as files_module
from storage.files import FileIO
from tests.support import fetch_token, sql, write_auth_file

from .delta.conftest import COLUMNS, FIRST as DELTA_FIRST, UC, local_path as delta_local, table_properties
from .lance.conftest import fake_manifest, stage

CLIENTS = {
    "admin": ("admin-secret", [("*", ["admin"])]),
    # a Lance writer in `db`, with no Iceberg grant at all
    "lancer": ("lancer-secret", [("lance/db", ["read", "write", "create", "drop"])]),
    # an Iceberg writer in `db` (a register names a file)
    "icer": ("icer-secret", [("iceberg//db", ["read", "write", "create", "drop"])]),
}
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


@pytest.fixture
def secured(config, tmp_path):
    config.auth_file = write_auth_file(tmp_path / "auth.toml", CLIENTS)
    with EmbeddedService(config) as base_url:
        yield base_url


def _client(base_url: str, cid: str) -> httpx.Client:
    token = fetch_token(base_url, cid, CLIENTS[cid][0])
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


@pytest.fixture
def admin(secured):
    with _client(secured, "admin") as client:
        client.post("/v1/namespaces", json={"namespace": ["db"]}).raise_for_status()
        client.post("/v1/namespace/db/create", json={}).raise_for_status()
        yield client


@pytest.fixture
def lancer(secured, admin):
    with _client(secured, "lancer") as client:
        yield client


@pytest.fixture
def icer(secured, admin):
    with _client(secured, "icer") as client:
        yield client


@pytest.fixture
def warehouse(config) -> Path:
    return Path(config.warehouse_uri.removeprefix("file://"))


def lance_error(r: httpx.Response, status: int = 400) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["error"] and body["detail"] and body["instance"], body
    return body["error"]


def iceberg_error(r: httpx.Response, status: int = 400) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    return r.json()["error"]["message"]


def tree(path: Path) -> dict[str, bytes]:
    """Every file below `path` and its bytes (links as what they point to, not followed)."""
    return {str(p.relative_to(path)): (os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(path.rglob("*")) if p.is_symlink() or p.is_file()}


# -- 1. deletion within a table's place ------------------------------------------------------------------------


@pytest.mark.parametrize("trick", ["..%2ftarget.txt", "..%2Ftarget.txt", "..%5ctarget.txt", "..%5Ctarget.txt",
                                   "%2e%2e/target.txt", "../target.txt", "sub/../../target.txt",
                                   "x/..%2f..%2ftarget.txt"])
def test_a_lance_manifest_path_deletes_nothing_outside_its_table(lancer, tmp_path, trick):
    """The attack: a symlink `_versions` in the writer's own table directory leading out, a file ending in `LANC`
    where the path's text leads (so the staged manifest reads well), and one batch that creates a version from
    `_versions/..%2ftarget.txt` and deletes it again, whose clean-up removes the staged file: the kernel would
    resolve the link, and unlink the file next to where it leads."""
    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    target = outside / "target.txt"
    target.write_text("not the table's")
    location = lancer.post("/v1/table/db$t/declare", json={}).json()["location"]
    table = Path(location.removeprefix("file://"))
    table.mkdir(parents=True, exist_ok=True)
    (table / "target.txt").write_bytes(fake_manifest())
    (table / "_versions").symlink_to(outside / "dir")
    operations = [
        {"create_table_version": {"id": ["db", "t"], "version": 1,
                                  "manifest_path": f"{location}/_versions/{trick}"}},
        {"delete_table_versions": {"id": ["db", "t"], "ranges": [{"start_version": 1, "end_version": -1}]}},
    ]
    r = lancer.post("/v1/table/batch-commit", json={"operations": operations})
    assert target.read_text() == "not the table's"
    assert (table / "target.txt").exists() and (table / "_versions").is_symlink()
    lance_error(r)
    # One operation alone, and the object-store path form pylance sends, are refused the same way.
    for path in (f"{location}/_versions/{trick}", f"{location.removeprefix('file:///')}/_versions/{trick}"):
        r = lancer.post("/v1/table/db$t/version/create", json={"version": 1, "manifest_path": path})
        lance_error(r)
        assert target.read_text() == "not the table's"
    assert lancer.post("/v1/table/db$t/version/list", json={}).json()["versions"] == []


# -- 2. a drop deletes only its own table's files; a declared location holds nothing --------------------------


@pytest.fixture
def iceberg(secured, admin):
    """pyiceberg as the Iceberg writer: data files, manifests and metadata, as a real engine writes them."""
    return load_catalog("icer", type="rest", uri=secured, credential="icer:icer-secret",
                        **{"oauth2-server-uri": f"{secured}/v1/oauth/tokens"})


NOT_NEW = "not a new Lance table's"   # a declare's refusal of a place that holds others' files
ROWS = pa.table({"id": pa.array([1, 2, 3], pa.int64())})


def written(catalog, name: str, **properties: str):
    table = catalog.create_table(f"db.{name}", pa.schema([("id", pa.int64())]), properties=properties)
    table.append(ROWS)
    return catalog.load_table(f"db.{name}")


def plant_lance_table(place: Path) -> None:
    """What a Lance writer with files access puts in a place to register it: a manifest and a data file."""
    (place / "_versions").mkdir(parents=True, exist_ok=True)
    (place / "_versions" / "1.manifest").write_bytes(fake_manifest())
    (place / "data").mkdir(exist_ok=True)
    (place / "data" / "planted.lance").write_bytes(b"lance data")


def purges_ended(database_url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while sql(database_url, "SELECT count(*) FROM purges")[0][0]:
        assert time.monotonic() < deadline, "a drop's deletion did not end"
        time.sleep(0.1)


def lance_drop(lancer: httpx.Client, name: str, database_url: str) -> None:
    assert lancer.post(f"/v1/table/db${name}/drop", json={}).status_code == 200
    purges_ended(database_url)


def test_a_lance_grant_cannot_erase_an_iceberg_tables_files_left_where_it_moved_from(lancer, icer, iceberg,
                                                                                    database_url):
    """An Iceberg table written, then moved by `set-location`: its snapshots still read the files in its first
    place. A Lance client declaring there is refused (the place holds files); registering a Lance table it
    planted there and dropping it deletes only Lance's own files; the Iceberg table reads as before."""
    table = written(iceberg, "ice")
    first = Path(table.location().removeprefix("file://"))
    r = icer.post("/v1/namespaces/db/tables/ice", json={"requirements": [], "updates": [
        {"action": "set-location", "location": f"{table.location()}-moved"}]})
    assert r.status_code == 200, r.text
    before = tree(first)
    assert any(name.endswith(".parquet") for name in before), before
    r = lancer.post("/v1/table/db$t/declare", json={"location": first.as_uri()})
    assert NOT_NEW in lance_error(r)
    assert lancer.post("/v1/table/db$t/describe", json={}).status_code == 404
    plant_lance_table(first)
    assert lancer.post("/v1/table/db$t/register", json={"location": first.as_uri()}).status_code == 200
    lance_drop(lancer, "t", database_url)
    assert tree(first) == before, "the drop deleted files that were not the Lance table's own"
    assert iceberg.load_table("db.ice").scan().to_arrow().num_rows == 3


def test_a_lance_grant_cannot_erase_the_files_a_drop_without_purge_kept(lancer, iceberg, database_url):
    """An Iceberg table dropped without purge keeps its files, for a later register: a Lance table declared there
    is refused, and one registered there and dropped leaves them; the Iceberg table registers again."""
    table = written(iceberg, "kept")
    place, metadata = Path(table.location().removeprefix("file://")), table.metadata_location
    iceberg.drop_table("db.kept")
    before = tree(place)
    assert NOT_NEW in lance_error(lancer.post("/v1/table/db$t/declare", json={"location": place.as_uri()}))
    plant_lance_table(place)
    assert lancer.post("/v1/table/db$t/register", json={"location": place.as_uri()}).status_code == 200
    lance_drop(lancer, "t", database_url)
    assert tree(place) == before
    assert iceberg.register_table("db.kept", metadata).scan().to_arrow().num_rows == 3


def test_a_lance_table_declared_in_an_iceberg_data_directory_deletes_only_its_own_files(lancer, iceberg, config,
                                                                                       database_url):
    """`write.data.path`: an Iceberg table's data files in a directory of their own, outside its location. A
    Lance table declared there while it is still empty is accepted (nothing is there yet); the Iceberg writer
    then writes its data there, the Lance writer its table; dropping the Lance table deletes Lance's files only,
    and a second declare there is refused."""
    data_dir = Path(config.warehouse_uri.removeprefix("file://")) / "db" / "shared-data"
    r = lancer.post("/v1/table/db$t/declare", json={"location": data_dir.as_uri()})
    assert r.status_code == 200, r.text
    written(iceberg, "ice", **{"write.data.path": data_dir.as_uri()})
    iceberg_files = tree(data_dir)
    assert iceberg_files and all(name.endswith(".parquet") for name in iceberg_files), iceberg_files
    r = lancer.post("/v1/table/db$t/version/create", json={"version": 1, "manifest_path": stage(data_dir.as_uri(), 1)})
    assert r.status_code == 200, r.text
    (data_dir / "data").mkdir(exist_ok=True)
    (data_dir / "data" / "fragment.lance").write_bytes(b"lance data")
    lance_drop(lancer, "t", database_url)
    assert tree(data_dir) == iceberg_files, "the Lance drop deleted the Iceberg table's data, or left its own"
    assert iceberg.load_table("db.ice").scan().to_arrow().num_rows == 3
    assert NOT_NEW in lance_error(lancer.post("/v1/table/db$t/declare", json={"location": data_dir.as_uri()}))


def test_a_lance_table_cannot_be_declared_where_a_staged_iceberg_create_wrote_its_files(lancer, iceberg, warehouse):
    """A create transaction in flight (pyiceberg: stage-create, data files written, then the commit with
    `assert-create`): a Lance table is not declared over its files, and the Iceberg create then commits."""
    place = warehouse / "db" / "staged"
    tx = iceberg.create_table_transaction("db.staged", pa.schema([("id", pa.int64())]), location=place.as_uri())
    tx.append(ROWS)
    before = tree(place)
    assert any(name.endswith(".parquet") for name in before), before
    assert NOT_NEW in lance_error(lancer.post("/v1/table/db$t/declare", json={"location": place.as_uri()}))
    tx.commit_transaction()
    assert iceberg.load_table("db.staged").scan().to_arrow().num_rows == 3


def test_a_drop_deletes_everything_only_in_the_directory_the_service_gave_the_table(lancer, database_url):
    """Declared without a location, a table's directory is named after its id: nothing there is anyone else's,
    and its drop deletes all of it."""
    location = lancer.post("/v1/table/db$t/declare", json={}).json()["location"]
    place = Path(location.removeprefix("file://"))
    assert lancer.post("/v1/table/db$t/version/create", json={"version": 1, "manifest_path": stage(location, 1)}
                       ).status_code == 200
    (place / "notes.txt").write_text("the writer's own")
    lance_drop(lancer, "t", database_url)
    assert not place.exists()


# -- 4. a file a client names is read only as a regular file, bounded, and stalls nothing ------------------------


def iceberg_metadata(location: str) -> bytes:
    """A real table's metadata, as a register names it (written by the service for a table dropped since)."""
    return json.dumps({"format-version": 2, "table-uuid": str(uuid.uuid4()), "location": location,
                       "last-sequence-number": 0, "last-updated-ms": 1, "last-column-id": 1, "current-schema-id": 0,
                       "schemas": [SCHEMA], "default-spec-id": 0, "partition-specs": [{"spec-id": 0, "fields": []}],
                       "last-partition-id": 999, "default-sort-order-id": 0,
                       "sort-orders": [{"order-id": 0, "fields": []}], "properties": {}, "snapshots": [],
                       "snapshot-log": [], "metadata-log": []}).encode()


@contextmanager
def fifo(path: Path):
    """A FIFO at `path`; at the end a writer opens it and goes, so that a reader stuck in it (on a service that
    waits for one) is let go."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    try:
        yield path
    finally:
        let_go(path)


def let_go(path: Path) -> None:
    """Open the FIFO `path` to write, and close it: a reader waiting in it gets its end."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:   # no reader: nobody waits
        pass


def register(client: httpx.Client, name: str, metadata: Path, timeout_s: float = 10) -> httpx.Response:
    return client.post("/v1/namespaces/db/register", json={"name": name, "metadata-location": metadata.as_uri()},
                       timeout=timeout_s)


def test_an_iceberg_register_of_a_fifo_is_a_quick_400_and_holds_up_no_other_read(icer, lancer, warehouse):
    """The FIFO register answers at once (it is not a file), and meanwhile registers of real files and Lance
    commits, whose staged manifests are read too, go on."""
    good = warehouse / "db" / "good" / "metadata" / "v1.metadata.json"
    good.parent.mkdir(parents=True)
    good.write_bytes(iceberg_metadata((warehouse / "db" / "good").as_uri()))
    location = lancer.post("/v1/table/db$t/declare", json={}).json()["location"]
    with fifo(warehouse / "db" / "stalled" / "metadata" / "v1.metadata.json") as stalled:
        answers: dict[str, tuple[float, httpx.Response | Exception]] = {}

        def run(key: str, call) -> None:
            started = time.monotonic()
            try:
                answers[key] = (time.monotonic() - started, call())
            except Exception as exc:  # noqa: BLE001 - a timeout on a service that waits for the FIFO
                answers[key] = (time.monotonic() - started, exc)
            answers[key] = (time.monotonic() - started, answers[key][1])

        threads = [threading.Thread(target=run, args=("fifo", lambda: register(icer, "stalled", stalled)))]
        threads[0].start()
        time.sleep(0.5)   # (the FIFO's read first)
        threads += [threading.Thread(target=run, args=("good", lambda: register(icer, "good", good))),
                    threading.Thread(target=run, args=("lance", lambda: lancer.post(
                        "/v1/table/db$t/version/create", json={"version": 1, "manifest_path": stage(location, 1)},
                        timeout=10)))]
        for thread in threads[1:]:
            thread.start()
        for thread in threads:
            thread.join()
    for key in ("good", "lance"):
        took, r = answers[key]
        assert isinstance(r, httpx.Response) and r.status_code == 200, (key, r)
    took, r = answers["fifo"]
    assert isinstance(r, httpx.Response), f"the register of a FIFO got no answer: {r!r}"
    assert "not a regular file" in iceberg_error(r) and took < 5, (took, r.text)
    assert icer.get("/v1/namespaces/db/tables/stalled").status_code == 404


def test_an_iceberg_register_reads_no_file_through_a_link(icer, warehouse, tmp_path):
    """Neither a link in the file's place nor a directory link on the way to it is followed: the file elsewhere
    (here, metadata of a table located in `db`, so that only the link is wrong) is not read, nor registered."""
    elsewhere = tmp_path / "elsewhere" / "v1.metadata.json"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(iceberg_metadata((warehouse / "db" / "lured").as_uri()))
    (warehouse / "db").mkdir(parents=True, exist_ok=True)
    (warehouse / "db" / "link.metadata.json").symlink_to(elsewhere)
    (warehouse / "db" / "dirlink").symlink_to(elsewhere.parent, target_is_directory=True)
    for path in (warehouse / "db" / "link.metadata.json", warehouse / "db" / "dirlink" / "v1.metadata.json"):
        assert "link" in iceberg_error(register(icer, "lured", path)), path
        assert icer.get("/v1/namespaces/db/tables/lured").status_code == 404


def test_a_file_a_client_names_is_read_only_up_to_the_limit(icer, warehouse, monkeypatch):
    """Beyond MAX_READ_BYTES a file is refused before it is read (a sparse file of any size costs nothing to
    make, and would be read whole into memory)."""
    monkeypatch.setattr(files_module, "MAX_READ_BYTES", 4096, raising=False)
    big = warehouse / "db" / "big" / "v1.metadata.json"
    big.parent.mkdir(parents=True)
    data = iceberg_metadata((warehouse / "db" / "big").as_uri())
    big.write_bytes(data[:-1] + b" " * 4096 + b"}")   # valid JSON, just too large
    assert "at most 4096" in iceberg_error(register(icer, "big", big))
    assert icer.get("/v1/namespaces/db/tables/big").status_code == 404
    with open(warehouse / "db" / "huge.metadata.json", "wb") as f:
        f.truncate(64 << 30)   # 64 GiB, sparse
    assert "at most" in iceberg_error(register(icer, "huge", warehouse / "db" / "huge.metadata.json"))


def test_a_delta_first_commit_that_is_a_fifo_is_a_quick_400(secured, admin):
    """Creating a MANAGED table reads version 0 from the staging location: a FIFO there is refused at once."""
    uc = UC(secured)
    uc.http.headers.update(admin.headers)
    uc.setup_schema()
    staging = uc.staging("t")
    with fifo(delta_local(staging["staging_location"]) / "_delta_log" / DELTA_FIRST):
        started = time.monotonic()
        r = uc.http.post("/tables", json={
            "name": "t", "catalog_name": "main", "schema_name": "default", "table_type": "MANAGED",
            "data_source_format": "DELTA", "columns": COLUMNS, "storage_location": staging["staging_location"],
            "properties": table_properties(staging["id"])}, timeout=10)
        assert r.status_code == 400 and "regular file" in r.json()["message"], r.text
        assert time.monotonic() - started < 5
    assert uc.http.get("/tables/main.default.t").status_code == 404


async def test_a_staged_manifest_swapped_for_a_fifo_before_it_is_published_stalls_no_commit(tmp_path):
    """Between the read of a staged manifest and its publication a writer may put a FIFO in its place: the
    publication opens it without waiting, and writes the bytes it checked instead."""
    place = tmp_path / "t"
    (place / "_versions").mkdir(parents=True)
    staged = place / "_versions" / "1.manifest-x"
    with fifo(staged):
        release = threading.Timer(10, let_go, (staged,))   # (a service that waits for a writer waits no longer)
        release.start()
        started = time.monotonic()
        await FileIO(warehouse=tmp_path.as_uri()).write_many(
            [(str(place / "_versions" / "1.manifest"), b"checked", str(staged), str(place))])
        release.cancel()
    assert time.monotonic() - started < 5, "the publication waited for the FIFO's writer"
    assert (place / "_versions" / "1.manifest").read_bytes() == b"checked"


def test_a_drop_in_a_named_warehouse_deletes_all_of_the_directory_the_service_gave_the_table(config, tmp_path):
    """A namespace may place its tables in a warehouse of its own: a table declared there without a location
    still lives in a directory the service named after its id, and loses all of it, after a restart too."""
    from tests.test_warehouses import create

    lake = tmp_path / "lake"
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        assert create(base, "lake", lake.as_uri()).status_code == 201
        http.post("/v1/namespace/sales/create", json={"properties": {"warehouse": "lake"}}).raise_for_status()
        location = http.post("/v1/table/sales$t/declare", json={}).json()["location"]
        assert location.startswith(lake.as_uri())
        assert http.post("/v1/table/sales$t/version/create", json={"version": 1, "manifest_path": stage(location, 1)}
                         ).status_code == 200
    place = Path(location.removeprefix("file://"))
    (place / "notes.txt").write_text("the writer's own")
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:   # (knows nothing yet)
        assert http.post("/v1/table/sales$t/drop", json={}).status_code == 200
        purges_ended(config.database_url)
    assert not place.exists()


async def test_a_read_that_stalls_ends_at_its_timeout_and_holds_up_no_other(tmp_path, monkeypatch):
    """A read the file system does not answer (a hung mount, an object store that stops talking) is a 503 at
    READ_TIMEOUT_S, and the reads after it go on: any other read at once, on a thread of its own; a staged manifest
    (read in batches on the commit path) once the stalled batch is abandoned, at that timeout."""
    from storage.errors import FileUnavailable

    monkeypatch.setattr(files_module, "READ_TIMEOUT_S", 0.5)
    place = tmp_path / "t"
    (place / "_versions").mkdir(parents=True)
    for name in ("stalled", "fine"):
        (place / "_versions" / name).write_bytes(name.encode())
    stuck = threading.Event()
    real = FileIO.read_within_sync

    def hanging(self, uri, within=None, **options):
        if uri.endswith("stalled"):
            stuck.wait(10)
        return real(self, uri, within, **options)
    monkeypatch.setattr(FileIO, "read_within_sync", hanging)
    files = FileIO()
    try:
        for read, at_most_s in ((files.read, 0.3), (files.read_durable, 0.5 + 0.3)):
            async with trio.open_nursery() as nursery:
                async def stalled() -> None:
                    with pytest.raises(FileUnavailable, match="took longer than 0.5 s"):
                        await read(str(place / "_versions" / "stalled"), str(place))
                nursery.start_soon(stalled)
                await trio.sleep(0.1)   # (stalled by now)
                with trio.fail_after(at_most_s):
                    assert await read(str(place / "_versions" / "fine"), str(place)) == b"fine"
    finally:
        stuck.set()
