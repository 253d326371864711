"""The commit flows real clients run, for the raw trio load generator (the locustfiles run the same flows).

* Iceberg (Java/pyiceberg append): load the table once, then commit `add-snapshot` + `set-snapshot-ref main`
  guarded by `assert-ref-snapshot-id` (the snapshot the writer last saw); on 409 wait as the Java client does,
  reload the table and retry (`retry.py`).
* Delta (catalog-managed, UC commit coordinator): commit the staged commit as version last+1 via
  `POST /delta/preview/commits`; every `BACKFILL_EVERY` versions, report the backfill
  (`latest_backfilled_version`); on 409 read `latest_table_version` and retry, on 429 backfill and retry.
  `delta-uniform`: the same on tables the service converts to Iceberg (UniForm), whose staged commits and
  backfilled copies it reads, so they are written. `delta-v1`: the same through the Delta API v1.0 (updateTable
  with add-commit, set-latest-backfilled-version), as delta-spark 4.3 commits.
* Lance (external manifest store): `version/list` limit 1 (descending) for the latest version, stage a
  manifest, `version/create` at latest+1; on 409 wait as lance does, list again and retry; on any other error
  describe the table.

Client-side file I/O that the coordinator never reads is skipped (Iceberg manifest lists, Delta staged commit
files and their backfilled copies): it would load the machine without exercising the service. Lance staged
manifests ARE written, because the server reads them and writes the final manifest.

Each writer is one keep-alive connection; `commit()` is one logical commit including its retries, so its
duration is what the user waits for.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from coordinator.keys import new_key
from storage import files

from .http import HttpConnection
from .retry import Retry, schedule

UC = "/api/2.1/unity-catalog"
BACKFILL_EVERY = 5
SETUP_CONCURRENCY = 16
U64_MAX = 2**64 - 1

ICEBERG_SCHEMA = {"type": "struct", "schema-id": 0,
                  "fields": [{"id": 1, "name": "id", "type": "long", "required": False},
                             {"id": 2, "name": "data", "type": "string", "required": False}]}


class SetupError(SystemExit):
    pass


def _check(status: int, body: bytes, what: str, ok: tuple[int, ...] = (200,)) -> bytes:
    if status not in ok:
        raise SetupError(f"{what} failed with HTTP {status}: {body[:500]!r}; is the service healthy (see its log)?")
    return body


@dataclass
class Stats:
    """What one run observed, across all writers."""

    commits: int = 0            # logical commits that succeeded
    writes: int = 0             # successful write requests (commits + Delta backfill reports)
    requests: int = 0           # every request sent, reloads and retries included
    conflicts: int = 0          # 409s
    gave_up: int = 0            # logical commits the client abandoned after its last retry
    errors: int = 0             # anything else that was not 2xx
    error_samples: list[str] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)   # per logical commit, retries included
    commit_request_latencies_s: list[float] = field(default_factory=list)   # per commit request, 409s included
    late: int = 0               # open loop: due in the window but not started before it ended

    def error(self, status: int, body: bytes) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(f"{status}: {body[:200].decode(errors='replace')}")


class Writer(ABC):
    """One client: a keep-alive connection and what it believes the table's state is."""

    retry_mode = "client"   # how it waits after a 409: see retry.py

    def __init__(self, base: str, table: Any, stats: Stats):
        self.conn = HttpConnection(base)
        self.table = table
        self.stats = stats
        self.rng = random.Random()

    async def request(self, method: str, path: str, body: Any = None, *, commit: bool = False,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """`commit`: a commit request, whose own latency (what the coordinator adds) is recorded too."""
        self.stats.requests += 1
        started = time.perf_counter()
        with trio.fail_after(60):
            answer = await self.conn.request(method, path, body, headers)
        if commit:
            self.stats.commit_request_latencies_s.append(time.perf_counter() - started)
        return answer

    async def start(self) -> None:
        """Connect and read the table's state, as a client does before its first commit."""

    @abstractmethod
    async def commit(self, deadline: float) -> bool:
        """One commit, retried as the protocol's real client would; True if it landed before `deadline`."""

    async def close(self) -> None:
        await self.conn.close()

    async def wait_to_retry(self, retry: Retry, deadline: float) -> bool:
        """After a 409: wait as the client would; False if it gives up instead."""
        wait = retry.next_wait(time.perf_counter(), deadline)
        if wait is None:
            self.stats.gave_up += 1
            return False
        if wait > 0:
            await trio.sleep(wait)
        return True

    async def _backoff(self, status: int, body: bytes) -> None:
        self.stats.error(status, body)
        await trio.sleep(0.01 + 0.02 * self.rng.random())


class Flow(ABC):
    name: str
    # Whether each commit makes a new file durable in the service before it is acknowledged (Iceberg's metadata
    # file, Lance's manifest): then its floor is the bare app with `--durable-file` (loadtest/bare.py).
    durable_file: bool = False

    @abstractmethod
    async def prepare(self, base: str, count: int, tag: str) -> list[Any]:
        """Create `count` fresh tables through the API; returns what writers need to address them."""

    @abstractmethod
    def writer(self, base: str, table: Any, stats: Stats) -> Writer:
        """A writer for one table."""

    @abstractmethod
    def sample_request(self, table: int = 0) -> tuple[str, Any]:
        """(path, body) of one commit request to the `table`th table as the flow sends it: the bare app parses
        exactly this."""


class TakingTurns(Flow):
    """One writer that commits to several tables in turn, one commit at a time: a commit load of one writer
    that grows each table only 1/len(tables) as fast. The benchmark uses it to measure a commit to a table of N
    snapshots while the table stays near N (one table, committed to for seconds, would grow by thousands).
    Its "table" is a tuple of the inner flow's tables."""

    def __init__(self, inner: Flow):
        self.inner = inner
        self.name = inner.name
        self.durable_file = inner.durable_file

    async def prepare(self, base: str, count: int, tag: str) -> list[Any]:
        return [tuple(await self.inner.prepare(base, count, tag))]

    def writer(self, base: str, table: tuple, stats: Stats) -> Writer:
        return _TurnWriter([self.inner.writer(base, t, stats) for t in table])

    def sample_request(self, table: int = 0) -> tuple[str, Any]:
        return self.inner.sample_request(table)


class _TurnWriter(Writer):
    def __init__(self, writers: list[Writer]):
        self.writers = writers
        self.turn = 0

    async def start(self) -> None:
        for w in self.writers:
            w.retry_mode = self.retry_mode   # (set on this writer by the runner)
            await w.start()

    async def commit(self, deadline: float) -> bool:
        w = self.writers[self.turn]
        self.turn = (self.turn + 1) % len(self.writers)
        return await w.commit(deadline)

    async def close(self) -> None:
        for w in self.writers:
            await w.close()


async def parallel(base: str, items: list[Any], fn: Callable[[HttpConnection, Any], Awaitable[Any]],
                   concurrency: int = SETUP_CONCURRENCY) -> list[Any]:
    """Run fn(conn, item) for every item over `concurrency` keep-alive connections; results in item order."""
    results: list[Any] = [None] * len(items)
    send, receive = trio.open_memory_channel[tuple[int, Any]](len(items))
    for pair in enumerate(items):
        send.send_nowait(pair)
    send.close()

    async def worker() -> None:
        conn = HttpConnection(base)
        try:
            async for i, item in receive:
                results[i] = await fn(conn, item)
        finally:
            await conn.close()

    async with trio.open_nursery() as n:
        for _ in range(min(concurrency, max(len(items), 1))):
            n.start_soon(worker)
    return results


# -- Iceberg ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IcebergTable:
    namespace: str
    name: str

    @property
    def path(self) -> str:
        return f"/v1/namespaces/{self.namespace}/tables/{self.name}"


def iceberg_commit_body(parent: int | None, new_id: int, seq: int, *, manifest_list: str | None = None,
                        summary: dict[str, str] | None = None) -> dict:
    """An append of snapshot `new_id` on top of `parent` (main's current snapshot), guarded by it."""
    snap = {"snapshot-id": new_id, "sequence-number": seq, "timestamp-ms": int(time.time() * 1000),
            "manifest-list": manifest_list or f"file:///tmp/loadtest/snap-{new_id}-{uuid.uuid4()}.avro",
            "summary": summary or {"operation": "append", "added-data-files": "1", "added-records": "100",
                                   "added-files-size": "4096"},
            "schema-id": 0}
    if parent is not None:
        snap["parent-snapshot-id"] = parent
    return {"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": parent}],
            "updates": [{"action": "add-snapshot", "snapshot": snap},
                        {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": new_id}]}


def iceberg_state(body: bytes) -> tuple[int | None, int]:
    meta = orjson.loads(body)["metadata"]
    current = meta.get("current-snapshot-id")
    return (None if current in (None, -1) else current), meta.get("last-sequence-number", 0)


class IcebergWriter(Writer):
    snapshot_id: int | None = None
    seq: int = 0
    idempotency_keys = False  # send an Idempotency-Key with each commit request, as a client may (`/v1/config`)

    @property
    def table_path(self) -> str:
        return self.table.path

    async def reload(self) -> None:
        status, body = await self.request("GET", self.table_path)
        _check(status, body, f"loading Iceberg table {self.table.name}")
        self.snapshot_id, self.seq = iceberg_state(body)

    async def start(self) -> None:
        await self.reload()

    def commit_body(self, new_id: int) -> dict:
        """The commit of snapshot `new_id` on the snapshot this writer last saw."""
        return iceberg_commit_body(self.snapshot_id, new_id, self.seq + 1)

    async def landed(self, new_id: int, answer: bytes) -> None:
        """The commit of `new_id` was answered 200 with `answer`."""
        self.snapshot_id, self.seq = new_id, self.seq + 1

    async def commit(self, deadline: float) -> bool:
        retry = schedule("iceberg", self.retry_mode, self.rng, time.perf_counter())
        while time.perf_counter() < deadline:
            new_id = self.rng.getrandbits(62)
            body = self.commit_body(new_id)
            # A retry after a 409 is a new commit (new parent, new snapshot), so it gets a new key.
            headers = {"Idempotency-Key": new_key()} if self.idempotency_keys else None
            status, body = await self.request("POST", self.table_path, body, commit=True, headers=headers)
            if status == 200:
                await self.landed(new_id, body)
                self.stats.writes += 1
                return True
            if status == 409:
                self.stats.conflicts += 1
                retrying = await self.wait_to_retry(retry, deadline)
                await self.reload()
                if not retrying:
                    return False
            else:
                await self._backoff(status, body)
        return False


class IcebergFlow(Flow):
    name = "iceberg"
    durable_file = True

    def __init__(self, idempotency_keys: bool = False):
        self.idempotency_keys = idempotency_keys

    async def prepare(self, base: str, count: int, tag: str) -> list[IcebergTable]:
        conn = HttpConnection(base)
        status, body = await conn.request("POST", "/v1/namespaces", {"namespace": [tag]})
        await conn.close()
        _check(status, body, f"creating Iceberg namespace {tag}")

        async def create(c: HttpConnection, i: int) -> IcebergTable:
            t = IcebergTable(tag, f"t{i}")
            s, b = await c.request("POST", f"/v1/namespaces/{tag}/tables", {"name": t.name, "schema": ICEBERG_SCHEMA})
            _check(s, b, f"creating Iceberg table {tag}.{t.name}")
            return t
        return await parallel(base, list(range(count)), create)

    def writer(self, base: str, table: IcebergTable, stats: Stats) -> IcebergWriter:
        w = IcebergWriter(base, table, stats)
        w.idempotency_keys = self.idempotency_keys
        return w

    def sample_request(self, table: int = 0) -> tuple[str, Any]:
        rng = random.Random()
        return f"/v1/namespaces/bench/tables/t{table}", iceberg_commit_body(rng.getrandbits(62), rng.getrandbits(62), 7)


class IcebergPropsWriter(IcebergWriter):
    """`set-properties` with no requirement: never conflicts, so it measures the coordinator's raw commit rate
    on a table (not a client flow)."""

    async def commit(self, deadline: float) -> bool:
        while time.perf_counter() < deadline:
            status, body = await self.request("POST", self.table.path, {
                "requirements": [], "updates": [{"action": "set-properties",
                                                 "updates": {"k": str(self.rng.getrandbits(32))}}]}, commit=True)
            if status == 200:
                self.stats.writes += 1
                return True
            await self._backoff(status, body)
        return False


class IcebergPropsFlow(IcebergFlow):
    name = "iceberg-props"

    def writer(self, base: str, table: IcebergTable, stats: Stats) -> IcebergPropsWriter:
        return IcebergPropsWriter(base, table, stats)


# -- Delta (Unity Catalog catalog-managed commits) -------------------------------------------------------------

DELTA_SCHEMA_STRING = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "data", "type": "string", "nullable": True, "metadata": {}}]})
DELTA_COLUMNS = [
    {"name": "id", "type_text": "bigint", "type_name": "LONG", "position": 0, "nullable": True,
     "type_json": '{"name":"id","type":"long","nullable":true,"metadata":{}}'},
    {"name": "data", "type_text": "string", "type_name": "STRING", "position": 1, "nullable": True,
     "type_json": '{"name":"data","type":"string","nullable":true,"metadata":{}}'},
]


# UniForm (`delta-uniform`): the properties that make the service convert the table to Iceberg, and the schema
# with the column-mapping ids and physical names they need.
UNIFORM_PROPERTIES = {"delta.universalFormat.enabledFormats": "iceberg", "delta.enableIcebergCompatV2": "true",
                      "delta.columnMapping.mode": "name", "delta.columnMapping.maxColumnId": "2"}
UNIFORM_SCHEMA_STRING = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True,
     "metadata": {"delta.columnMapping.id": 1, "delta.columnMapping.physicalName": "col-id"}},
    {"name": "data", "type": "string", "nullable": True,
     "metadata": {"delta.columnMapping.id": 2, "delta.columnMapping.physicalName": "col-data"}}]})


def delta_first_commit(table_id: str, uniform: bool = False) -> bytes:
    """`_delta_log/00000000000000000000.json` of a catalog-managed table, as Delta writes it (`uniform`: with
    UniForm Iceberg, IcebergCompatV2 and column mapping on)."""
    now = int(time.time() * 1000)
    features = (["columnMapping"], ["columnMapping", "icebergCompatV2"]) if uniform else ([], [])
    actions = [
        {"commitInfo": {"inCommitTimestamp": now, "timestamp": now, "operation": "CREATE TABLE",
                        "operationParameters": {}, "isBlindAppend": True, "txnId": str(uuid.uuid4()),
                        "engineInfo": "coordinator-loadtest"}},
        {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                      "readerFeatures": ["catalogManaged", "vacuumProtocolCheck", *features[0]],
                      "writerFeatures": ["catalogManaged", "inCommitTimestamp", "vacuumProtocolCheck",
                                         *features[1]]}},
        {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                      "schemaString": UNIFORM_SCHEMA_STRING if uniform else DELTA_SCHEMA_STRING,
                      "partitionColumns": [],
                      "configuration": {"delta.enableInCommitTimestamps": "true", "io.unitycatalog.tableId": table_id,
                                        **(UNIFORM_PROPERTIES if uniform else {})},
                      "createdTime": now}},
    ]
    return b"".join(orjson.dumps(a) + b"\n" for a in actions)


def delta_properties(table_id: str) -> dict[str, str]:
    return {"delta.minReaderVersion": "3", "delta.minWriterVersion": "7",
            "delta.enableInCommitTimestamps": "true", "delta.feature.inCommitTimestamp": "supported",
            "delta.feature.vacuumProtocolCheck": "supported", "delta.feature.catalogManaged": "supported",
            "io.unitycatalog.tableId": table_id, "delta.lastUpdateVersion": "0"}


# obstore S3Store settings for the files a client writes (Delta's first commit, Lance's staged manifests) when
# the service's warehouse is on S3 (`commit_bench --warehouses s3`); None: local files only.
S3_OPTIONS: dict[str, str] | None = None


def _object(uri: str):
    """(store, key) for an s3:// URI, with the client's S3 settings."""
    if S3_OPTIONS is None:
        raise SetupError(f"table location {uri} is not on the local filesystem: the load generator writes the "
                         f"files a client writes (Delta's first commit, Lance's staged manifests), so run the "
                         f"service with a local warehouse, or let commit_bench start its S3 server "
                         f"(--warehouses s3)")
    from obstore.store import S3Store
    bucket, _, key = uri.split("://", 1)[1].partition("/")
    return S3Store(bucket, **S3_OPTIONS), key


async def put_client_file(uri: str, data: bytes) -> None:
    """Write a file as a client would: locally (blocking on purpose: a small file, its CPU in loadgen CPU), or a
    PUT to S3 in a worker thread (a round trip the other writers need not wait for)."""
    path = files.local_path(uri)
    if path is None:
        import obstore
        store, key = _object(uri)
        await trio.to_thread.run_sync(lambda: obstore.put(store, key, data))
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:  # noqa: ASYNC230
        f.write(data)


async def remove_client_file(uri: str) -> None:
    path = files.local_path(uri)
    if path is None:
        import obstore
        store, key = _object(uri)
        await trio.to_thread.run_sync(lambda: obstore.delete(store, key))
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@dataclass(frozen=True)
class DeltaTable:
    table_id: str
    uri: str
    path: str = ""   # its Delta API v1.0 path (`/delta/v1/catalogs/<c>/schemas/<s>/tables/<name>`)


def delta_commit_body(table: DeltaTable, version: int, size: int = 2048, name: str | None = None) -> dict:
    now = int(time.time() * 1000)
    return {"table_id": table.table_id, "table_uri": table.uri,
            "commit_info": {"version": version, "timestamp": now,
                            "file_name": name or f"{version:020d}.{uuid.uuid4()}.json",
                            "file_size": size, "file_modification_timestamp": now}}


class DeltaWriter(Writer):
    last: int = 0

    @property
    def _ident(self) -> dict:
        return {"table_id": self.table.table_id, "table_uri": self.table.uri}

    async def refresh(self) -> None:
        """GET commits (body as Delta's client sends it): the latest ratified version."""
        status, body = await self.request("GET", f"{UC}/delta/preview/commits",
                                          {**self._ident, "start_version": self.last + 1})
        _check(status, body, f"reading commits of Delta table {self.table.table_id}")
        self.last = orjson.loads(body)["latest_table_version"]

    async def start(self) -> None:
        await self.refresh()

    async def staged_commit(self, version: int) -> dict:
        """The commit request for the staged commit file of `version` (not written: the service does not read it)."""
        return delta_commit_body(self.table, version)

    def backfill_request(self, version: int) -> tuple[str, dict]:
        """Where the report that versions <= `version` are published is sent, and its body."""
        return f"{UC}/delta/preview/commits", {**self._ident, "latest_backfilled_version": version}

    async def backfill(self, version: int) -> None:
        """The writer published versions <= `version` as `_delta_log/<v>.json` (skipped here) and says so."""
        await self.publish(version)
        status, body = await self.request("POST", *self.backfill_request(version))
        if status == 200:
            self.stats.writes += 1
        else:
            self.stats.error(status, body)

    async def commit_request(self, version: int) -> tuple[str, dict]:
        """Where the commit of `version` is sent, and its body."""
        return f"{UC}/delta/preview/commits", await self.staged_commit(version)

    async def commit(self, deadline: float) -> bool:
        while time.perf_counter() < deadline:
            v = self.last + 1
            status, body = await self.request("POST", *await self.commit_request(v), commit=True)
            if status == 200:
                self.last = v
                self.acked(v)
                self.stats.writes += 1
                if v % BACKFILL_EVERY == 0:
                    await self.backfill(v)
                return True
            if status == 409:
                self.stats.conflicts += 1
                await self.refresh()
            elif status == 429:
                # Too many unpublished commits (a backfilling writer is behind): publish up to the latest.
                self.stats.error(status, body)
                await self.refresh()
                await self.backfill(self.last)
            else:
                await self._backoff(status, body)
        return False

    async def publish(self, version: int) -> None:
        """Copy versions up to `version` to `_delta_log/<v>.json` (skipped here: the service does not read them)."""

    def acked(self, version: int) -> None:
        """`version` was ratified (uniform_bench times the Iceberg side from it)."""


class DeltaUniformWriter(DeltaWriter):
    """A writer of a table the service converts to Iceberg: the service reads its staged commits and their
    backfilled copies, so both are written (one add action each, with the stats an IcebergCompatV2 writer gives;
    the data file itself is not written: a conversion never reads it)."""

    def __init__(self, base: str, table: DeltaTable, stats: Stats):
        super().__init__(base, table, stats)
        self.staged: dict[int, tuple[str, bytes]] = {}   # its ratified commits not yet published
        self.acked_at: dict[int, float] = {}

    async def staged_commit(self, version: int) -> dict:
        now = int(time.time() * 1000)
        stats = {"numRecords": 1, "minValues": {"col-id": version}, "maxValues": {"col-id": version},
                 "nullCount": {"col-id": 0, "col-data": 0}}
        actions = [{"commitInfo": {"inCommitTimestamp": now, "timestamp": now, "operation": "WRITE"}},
                   {"add": {"path": f"part-{uuid.uuid4()}.parquet", "partitionValues": {}, "size": 1024,
                            "modificationTime": now, "dataChange": True, "stats": json.dumps(stats)}}]
        data = b"".join(orjson.dumps(a) + b"\n" for a in actions)
        name = f"{version:020d}.{uuid.uuid4()}.json"
        await put_client_file(files.join(self.table.uri, "_delta_log", "_staged_commits", name), data)
        self.staged[version] = (name, data)
        return delta_commit_body(self.table, version, len(data), name)

    async def publish(self, version: int) -> None:
        for v in sorted(v for v in self.staged if v <= version):
            _, data = self.staged.pop(v)
            await put_client_file(files.join(self.table.uri, "_delta_log", f"{v:020d}.json"), data)

    def acked(self, version: int) -> None:
        self.acked_at[version] = time.perf_counter()


class DeltaFlow(Flow):
    name = "delta"
    catalog = "bench"

    uniform = False

    async def prepare(self, base: str, count: int, tag: str) -> list[DeltaTable]:
        conn = HttpConnection(base)
        s, b = await conn.request("POST", f"{UC}/catalogs", {"name": self.catalog})
        _check(s, b, "creating the UC catalog", (200, 409))
        s, b = await conn.request("POST", f"{UC}/schemas", {"name": tag, "catalog_name": self.catalog})
        _check(s, b, f"creating UC schema {tag}")
        await conn.close()

        async def create(c: HttpConnection, i: int) -> DeltaTable:
            name = f"t{i}"
            s, b = await c.request("POST", f"{UC}/staging-tables",
                                   {"name": name, "catalog_name": self.catalog, "schema_name": tag})
            staging = orjson.loads(_check(s, b, f"creating staging table {name}"))
            location = staging["staging_location"]
            await put_client_file(files.join(location, "_delta_log", "00000000000000000000.json"),
                                  delta_first_commit(staging["id"], self.uniform))
            s, b = await c.request("POST", f"{UC}/tables", {
                "name": name, "catalog_name": self.catalog, "schema_name": tag, "table_type": "MANAGED",
                "data_source_format": "DELTA", "columns": DELTA_COLUMNS, "storage_location": location,
                "properties": {**delta_properties(staging["id"]), **(UNIFORM_PROPERTIES if self.uniform else {})}})
            info = orjson.loads(_check(s, b, f"creating Delta table {name}"))
            return DeltaTable(info["table_id"], info["storage_location"],
                              f"{UC}/delta/v1/catalogs/{self.catalog}/schemas/{tag}/tables/{name}")
        return await parallel(base, list(range(count)), create)

    def writer(self, base: str, table: DeltaTable, stats: Stats) -> DeltaWriter:
        return DeltaWriter(base, table, stats)

    def sample_request(self, table: int = 0) -> tuple[str, Any]:
        t = DeltaTable(str(uuid.uuid4()), f"file:///tmp/warehouse/bench/{uuid.uuid4()}")   # a table of its own
        return f"{UC}/delta/preview/commits", delta_commit_body(t, 7)


def delta_v1_commit_body(table: DeltaTable, version: int) -> dict:
    """updateTable (Delta API v1.0): add-commit of the staged commit of `version`."""
    now = int(time.time() * 1000)
    updates = [{"action": "add-commit", "commit": {
        "version": version, "timestamp": now, "file-name": f"{version:020d}.{uuid.uuid4()}.json", "file-size": 2048,
        "file-modification-timestamp": now}}]
    return {"requirements": [{"type": "assert-table-uuid", "uuid": table.table_id}], "updates": updates}


class DeltaV1Writer(DeltaWriter):
    """The Delta flow through the Delta API v1.0, as delta-spark 4.3 commits: loadTable for the latest version,
    updateTable with add-commit (its answer is the table after it), and every BACKFILL_EVERY versions the backfill
    reported in a request of its own (set-latest-backfilled-version), as the preview flow reports it: the same
    requests per commit, so their CPU compares request for request."""

    async def refresh(self) -> None:
        status, body = await self.request("GET", self.table.path)
        _check(status, body, f"loading Delta table {self.table.path}")
        self.last = orjson.loads(body)["latest-table-version"]

    def backfill_request(self, version: int) -> tuple[str, dict]:
        return self.table.path, {"requirements": [{"type": "assert-table-uuid", "uuid": self.table.table_id}],
                                 "updates": [{"action": "set-latest-backfilled-version",
                                              "latest-published-version": version}]}

    async def commit_request(self, version: int) -> tuple[str, dict]:
        return self.table.path, delta_v1_commit_body(self.table, version)


class DeltaV1Flow(DeltaFlow):
    """The Delta flow through the Delta API v1.0 (`/delta/v1`), on tables created as the preview flow's are."""

    name = "delta-v1"

    def writer(self, base: str, table: DeltaTable, stats: Stats) -> DeltaV1Writer:
        return DeltaV1Writer(base, table, stats)

    def sample_request(self, table: int = 0) -> tuple[str, Any]:
        t = DeltaTable(str(uuid.uuid4()), "", f"{UC}/delta/v1/catalogs/bench/schemas/s/tables/t{table}")
        return t.path, delta_v1_commit_body(t, 7)


class DeltaUniformFlow(DeltaFlow):
    """The Delta flow on tables the service converts to Iceberg (UniForm): what conversion costs the commit path."""

    name = "delta-uniform"
    uniform = True

    def writer(self, base: str, table: DeltaTable, stats: Stats) -> DeltaUniformWriter:
        return DeltaUniformWriter(base, table, stats)


# -- Lance (Lance Namespace REST, external manifest store) -------------------------------------------------------


@dataclass(frozen=True)
class LanceTable:
    ident: str          # levels joined by "$", as in the route
    levels: tuple[str, ...]
    location: str       # its URI, file:// or s3:// (the locustfiles: its local directory)

    @property
    def route(self) -> str:
        return "/v1/table/" + self.ident


def lance_manifest_name(version: int) -> str:
    """V2 naming: u64::MAX - version, zero-padded (what Lance writes for new tables)."""
    return f"{U64_MAX - version:020d}.manifest"


def local_path(uri: str) -> str:
    """A location's local path, for the locustfiles (which run against a local warehouse only)."""
    path = files.local_path(uri)
    if path is None:
        raise SetupError(f"table location {uri} is not on the local filesystem: run the service with a local "
                         f"warehouse")
    return path


def stage_manifest(location: str, version: int) -> str:
    """Write a staged manifest into a local table directory (the locustfiles); returns its object path."""
    path = os.path.join(location, "_versions", f"{lance_manifest_name(version)}-{uuid.uuid4()}")
    with open(path, "wb") as f:
        f.write(b"loadtest manifest " + uuid.uuid4().bytes + os.urandom(64) + b"LANC")
    return path.lstrip("/")


async def stage_manifest_at(location: str, version: int) -> tuple[str, str]:
    """Write a staged manifest the way Lance does (`_versions/<final name>-<uuid>`); returns its URI and its
    object path (what Lance sends: no scheme, no bucket)."""
    uri = files.join(location, "_versions", f"{lance_manifest_name(version)}-{uuid.uuid4()}")
    # Unique content ending in Lance's magic: the server checks the footer and keeps the bytes.
    await put_client_file(uri, b"loadtest manifest " + uuid.uuid4().bytes + os.urandom(64) + b"LANC")
    path = files.local_path(uri)
    return uri, path.lstrip("/") if path is not None else uri.split("://", 1)[1].partition("/")[2]


def lance_create_body(table: LanceTable, version: int, manifest_path: str) -> dict:
    return {"id": list(table.levels), "version": version, "manifest_path": manifest_path}


class LanceWriter(Writer):
    latest: int = 0

    async def refresh(self) -> None:
        status, body = await self.request("POST", f"{self.table.route}/version/list?limit=1&descending=true",
                                          {"id": list(self.table.levels)})
        _check(status, body, f"listing versions of Lance table {self.table.ident}")
        versions = orjson.loads(body).get("versions") or []
        self.latest = versions[0]["version"] if versions else 0

    async def start(self) -> None:
        await self.refresh()

    async def commit(self, deadline: float) -> bool:
        retry = schedule("lance", self.retry_mode, self.rng, time.perf_counter())
        while time.perf_counter() < deadline:
            v = self.latest + 1
            staged_uri, staged = await stage_manifest_at(self.table.location, v)
            status, body = await self.request("POST", f"{self.table.route}/version/create",
                                              lance_create_body(self.table, v, staged), commit=True)
            if status == 200:
                self.latest = v
                self.stats.writes += 1
                return True
            await remove_client_file(staged_uri)
            if status == 409:
                self.stats.conflicts += 1
                retrying = await self.wait_to_retry(retry, deadline)
                await self.refresh()
                if not retrying:
                    return False
            else:
                # What pylance does on an unexpected answer: find out whether the table is still there.
                await self._backoff(status, body)
                await self.request("POST", f"{self.table.route}/describe", {"id": list(self.table.levels)})
                await self.refresh()
        return False


class LanceFlow(Flow):
    name = "lance"
    durable_file = True

    async def prepare(self, base: str, count: int, tag: str) -> list[LanceTable]:
        conn = HttpConnection(base)
        s, b = await conn.request("POST", f"/v1/namespace/{tag}/create", {"id": [tag]})
        await conn.close()
        _check(s, b, f"creating Lance namespace {tag}")

        async def declare(c: HttpConnection, i: int) -> LanceTable:
            levels = (tag, f"t{i}")
            ident = "$".join(levels)
            s, b = await c.request("POST", f"/v1/table/{ident}/declare", {"id": list(levels)})
            location = orjson.loads(_check(s, b, f"declaring Lance table {ident}"))["location"]
            return LanceTable(ident, levels, location)
        return await parallel(base, list(range(count)), declare)

    def writer(self, base: str, table: LanceTable, stats: Stats) -> LanceWriter:
        return LanceWriter(base, table, stats)

    def sample_request(self, table: int = 0) -> tuple[str, Any]:
        t = LanceTable(f"bench$t{table}", ("bench", f"t{table}"), f"file:///tmp/warehouse/bench/t{table}")
        path = f"tmp/warehouse/bench/t{table}/_versions/{lance_manifest_name(7)}-{uuid.uuid4()}"
        return f"{t.route}/version/create", lance_create_body(t, 7, path)


FLOWS: dict[str, Flow] = {f.name: f for f in (IcebergFlow(), DeltaFlow(), LanceFlow(), IcebergPropsFlow(),
                                               DeltaUniformFlow(), DeltaV1Flow())}
