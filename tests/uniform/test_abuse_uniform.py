"""A Delta writer cannot make the service's conversion to Iceberg grow without bound, nor stop it for other tables
(issue 39, rows 9 and 10): driven as the attacker would, through `loadtest.attacks.uniform` (the abuse run drives
the same), against the real service in a process of its own (its memory is measured from /proc).

- Schema churn: the converted metadata keeps only the schemas its snapshots use and stays within
  `uniform_max_metadata_bytes` (older snapshots expire early), a table whose schema alone is beyond it is refused
  with the reason, the service's memory stays bounded, and pyiceberg reads the table throughout.
- A schema nested deeper than the converter takes is refused with the reason, once (not retried), while the
  worker process lives on and converts the other tables; and a compiled extension's panic in a worker (pyo3's
  PanicException, a BaseException) is answered as a refusal by the same worker process.
"""

from __future__ import annotations

import os
import time
import uuid

import httpx
import pytest
import trio

from loadtest.attacks import Target
from loadtest.attacks.uniform import ATTACKS, ID_COLUMN, column, conversion_workers
from loadtest.procs import rss_bytes
from tests.delta.conftest import UC
from tests.support import ServerProcess

from .conftest import MOUNT, iceberg_catalog, wait_converted
from .support import ManagedDelta, batch, iceberg_rows

LIMIT = 1 << 20        # uniform_max_metadata_bytes here
CACHE = 4 << 20        # uniform_cache_bytes here
SNAPSHOTS_KEPT = 10    # conversion.SNAPSHOTS_KEPT
RSS_GROWTH_MAX = 64 << 20
CONVERSIONS = SNAPSHOTS_KEPT + 4   # conversions the churn watches: more than the schemas a table may keep


@pytest.fixture
def server(database_url, tmp_path):
    server = ServerProcess(database_url, tmp_path / "service", extra_env={
        "COORDINATOR_UNIFORM_WORKERS": "1", "COORDINATOR_UNIFORM_MAX_METADATA_BYTES": str(LIMIT),
        "COORDINATOR_UNIFORM_CACHE_BYTES": str(CACHE)})
    server.start()
    yield server
    server.stop()


def load(base_url: str, catalog: str, schema: str, name: str) -> httpx.Response:
    return httpx.get(f"{base_url}{MOUNT}/v1/catalogs/{catalog}/namespaces/{schema}/tables/{name}", timeout=30)


def metrics(base_url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line.startswith("coordinator_uniform_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_writer_churning_large_schemas_leaves_bounded_metadata_and_memory(server):
    base, pid = server.base_url, server.proc.pid
    target = Target(base, pid)
    # Each commit a schema of its own, 4 columns with a 64 KiB comment each, 20 commits a second: a conversion
    # each, or nearly. Kept whole, the metadata would grow by a schema (256 KiB) each time.
    seen = {"loads": 0, "largest": 0, "most_schemas": 0, "unused_schemas": 0, "read": None, "conversions": 0}
    rss_first, rss_peak = None, 0
    with ATTACKS["uniform-schema-churn"](target, columns=4, comment_bytes=64 << 10, pause_s=0.05) as run:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not run.errors and seen["conversions"] < CONVERSIONS:
            r = load(base, run.catalog, run.schema, "churn") if run.tables else None
            if r is not None and r.status_code == 200:
                metadata = r.json()["metadata"]
                rss_first = rss_first or rss_bytes(pid)   # (after the first conversion: the service warmed up)
                seen["loads"] += 1
                seen["largest"] = max(seen["largest"], len(r.content))
                seen["most_schemas"] = max(seen["most_schemas"], len(metadata["schemas"]))
                used = {metadata["current-schema-id"], *(s["schema-id"] for s in metadata["snapshots"])}
                seen["unused_schemas"] += len({s["schema-id"] for s in metadata["schemas"]} - used)
                if seen["read"] is None and int(metadata["properties"]["delta-version"]) >= SNAPSHOTS_KEPT:
                    table = iceberg_catalog(base, run.catalog).load_table(f"{run.schema}.churn")
                    seen["read"] = (int(table.properties["delta-version"]), len(iceberg_rows(table)))
            rss_peak = max(rss_peak, rss_bytes(pid))
            seen["conversions"] = metrics(base)["coordinator_uniform_conversions_total"]
            time.sleep(0.05)
    assert not run.errors, run.errors
    growth = f"RSS grew by {(rss_peak - (rss_first or rss_peak)) >> 20} MiB"
    # Many conversions, each with a schema of its own: the metadata kept only those its snapshots use (at most
    # one each, and the current), and stayed within the limit (older snapshots expired early: four of these
    # schemas fill it); pyiceberg read every row of a version.
    assert seen["conversions"] >= CONVERSIONS, f"{seen}, {growth}"
    assert seen["most_schemas"] <= SNAPSHOTS_KEPT + 1 and seen["unused_schemas"] == 0, f"{seen}, {growth}"
    assert seen["largest"] <= LIMIT + 4096, f"{seen}, {growth}"   # (the load's answer: the metadata, its location)
    assert seen["read"] is not None and seen["read"][1] == seen["read"][0] + 1, seen
    assert rss_peak - rss_first < RSS_GROWTH_MAX, f"{growth}: {seen}"
    assert 0 < metrics(base)["coordinator_uniform_metadata_cached_bytes"] <= CACHE

    # Schemas ever larger (4 more such columns each time): the one whose schema alone is beyond the limit is
    # refused, with the reason; a later version whose schema fits converts again, and reads.
    refusal = None
    with ATTACKS["uniform-schema-churn"](target, columns=4, comment_bytes=64 << 10, growth=4) as run:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not run.errors and refusal is None:
            r = load(base, run.catalog, run.schema, "churn") if run.tables else None
            if r is not None and r.status_code == 406:
                refusal = r.json()["error"]["message"]
            time.sleep(0.05)
    assert not run.errors, run.errors
    assert refusal is not None and "uniform_max_metadata_bytes" in refusal and str(LIMIT) in refusal, refusal
    counts = metrics(base)
    assert counts["coordinator_uniform_refusals_total"] >= 1 and counts["coordinator_uniform_failures_total"] == 0
    writer = run.writers["churn"]
    writer.http = httpx.Client(base_url=base, timeout=60)
    version = writer.commit([writer.metadata([ID_COLUMN, column(100_000)]), writer.data_file(writer.version + 1)])
    table = wait_converted(iceberg_catalog(base, run.catalog), f"{run.schema}.churn", version)
    assert len(iceberg_rows(table)) == version + 1
    assert [f.name for f in table.schema().fields] == ["id", "c100000"]
    assert len(table.metadata.schemas) <= SNAPSHOTS_KEPT + 1
    writer.http.close()


def test_a_deeply_nested_schema_is_refused_once_with_its_reason_and_others_still_convert(server, tmp_path):
    base, pid = server.base_url, server.proc.pid
    uc = UC(base)
    plain = ManagedDelta(uc, "plain", tmp_path).create(batch(range(3)))
    catalog = iceberg_catalog(base)
    wait_converted(catalog, "default.plain", 0)
    [worker] = conversion_workers(pid)
    with ATTACKS["uniform-deep-schema"](Target(base, pid), depth=100) as run:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not run.errors:
            r = load(base, run.catalog, run.schema, "deep0") if run.tables else None
            if r is not None and r.status_code == 406:
                break
            time.sleep(0.1)
        assert not run.errors, run.errors
        assert r is not None and r.status_code == 406, f"not refused in 30 s: {r and (r.status_code, r.text[:500])}"
        message = r.json()["error"]["message"]
        assert "Delta version 1 cannot be converted" in message and "nested more than 32 deep" in message, message
        version = plain.append(batch(range(3, 6)))
        assert iceberg_rows(wait_converted(catalog, "default.plain", version)) == plain.rows(version)
    before = metrics(base)
    time.sleep(3)   # (a retry would have come: the first after 1 s, then 2 s)
    after = metrics(base)
    assert after["coordinator_uniform_failures_total"] == 0, after
    assert after["coordinator_uniform_refusals_total"] == before["coordinator_uniform_refusals_total"] == 1
    assert after["coordinator_uniform_tables_behind"] == 0
    assert conversion_workers(pid) == [worker], "the conversion worker was replaced"
    assert load(base, run.catalog, run.schema, "deep0").status_code == 406
    uc.http.close()


def test_a_panic_in_a_compiled_extension_is_answered_and_the_worker_lives_on(tmp_path):
    """A real panic of obstore (Rust's object_store, through pyo3) in the real worker process: an S3 endpoint that is
    no URI makes it panic on its first request. The worker answers the job (a refusal naming the panic) and then
    converts the next job itself."""
    from coordinator.uniform.conversion import Converted, Job, Refused
    from coordinator.uniform.worker import Workers

    from .test_conversion import DeltaDir

    good = DeltaDir(tmp_path / "good", partitioned=False)
    good.commit({"add": {"path": "a.parquet", "partitionValues": {}, "size": 1, "modificationTime": 1,
                         "dataChange": True, "stats": '{"numRecords": 1}'}}, first=True)

    async def main() -> tuple:
        workers = Workers(1)
        try:
            panicking = Job(table_id=str(uuid.uuid4()), location="s3://bucket/table", target=0, staged={},
                            s3_options={"endpoint": "http://[::1", "skip_signature": "true"})
            first = await workers.run(panicking)
            pid = conversion_workers(os.getpid())
            second = await workers.run(Job(table_id=str(uuid.uuid4()), location=good.location, s3_options={},
                                           target=0, staged={}))
            return first, second, pid, conversion_workers(os.getpid())
        finally:
            workers.close()

    first, second, pid, pid_after = trio.run(main)
    assert isinstance(first, Refused) and "PanicException" in first.reason, first
    assert isinstance(second, Converted) and second.delta_version == 0
    assert len(pid) == 1 and pid == pid_after
