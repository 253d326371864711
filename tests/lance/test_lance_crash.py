"""Crash safety with pylance: SIGKILL the server under append load, restart it, and check that every version a
writer was told about is still there (describable, its manifest in place, its rows readable)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import lance
import lance_namespace
import pyarrow as pa
import pytest
from lance_namespace import CreateNamespaceRequest, DescribeTableRequest, ListTableVersionsRequest

from coordinator.lance.layout import object_path, version_of_manifest_name

from tests.support import ServerProcess

pytestmark = pytest.mark.crash


def _append_loop(base: str, table: str, writer: int, acked: list, stop: threading.Event) -> None:
    """Each attempt appends a value never used before; an acknowledged append must survive any crash."""
    ns = lance_namespace.connect("rest", {"uri": base})
    attempt = 0
    while not stop.is_set():
        value = writer * 1_000_000 + attempt
        attempt += 1
        try:
            ds = lance.write_dataset(pa.table({"a": [value]}), namespace_client=ns, table_id=["db", table],
                                     mode="append")
        except Exception:   # server down or the commit's outcome unknown to the client: try a new value
            time.sleep(0.05)
            continue
        acked.append((table, ds.version, value))


def test_acknowledged_versions_survive_sigkill(database_url, tmp_path):
    server = ServerProcess(database_url, tmp_path / "server")
    base = server.start()
    try:
        ns = lance_namespace.connect("rest", {"uri": base})
        ns.create_namespace(CreateNamespaceRequest(id=["db"]))
        tables = ["t0", "t1"]
        for t in tables:
            lance.write_dataset(pa.table({"a": [-1]}), namespace_client=ns, table_id=["db", t], mode="create")

        acked: list[tuple[str, int, int]] = []
        stop = threading.Event()
        writers = [threading.Thread(target=_append_loop, args=(base, tables[w % 2], w, acked, stop))
                   for w in range(4)]
        for w in writers:
            w.start()
        deadline = time.monotonic() + 20
        while len(acked) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.kill()                       # mid-load: some commits are in flight
        killed_at = len(acked)
        time.sleep(0.5)
        server.start()
        deadline = time.monotonic() + 20
        while len(acked) < killed_at + 10 and time.monotonic() < deadline:
            time.sleep(0.01)
        stop.set()
        for w in writers:
            w.join(timeout=60)
        assert killed_at >= 30 and len(acked) >= killed_at + 10, (killed_at, len(acked))

        ns = lance_namespace.connect("rest", {"uri": base})
        for t in tables:
            listed = [v.version for v in ns.list_table_versions(ListTableVersionsRequest(id=["db", t])).versions]
            assert listed == list(range(1, listed[-1] + 1)), f"{t}: versions must be contiguous"
            # Final manifests are exactly the recorded versions: none for a commit the crash cut short (Lance
            # writers probe final paths, and would skip a version), and a recorded one restored if it was lost.
            location = ns.describe_table(DescribeTableRequest(id=["db", t])).location
            on_disk = sorted(version_of_manifest_name(n)[0] for n in
                             os.listdir(Path("/" + object_path(location)) / "_versions")
                             if version_of_manifest_name(n))
            assert on_disk == listed
            latest = lance.dataset(namespace_client=ns, table_id=["db", t])
            values = set(latest.to_table()["a"].to_pylist())
            mine = [(v, value) for table, v, value in acked if table == t]
            assert len({v for v, _ in mine}) == len(mine), "two acknowledged appends share a version"
            for version, value in mine:
                described = ns.describe_table_version({"id": ["db", t], "version": version})["version"]
                assert Path("/" + described["manifest_path"]).exists()
                assert value in values, f"acknowledged append {value} (version {version}) of {t} was lost"
            # Spot-check that old acknowledged versions still open with their rows.
            for version, value in mine[:: max(1, len(mine) // 5)]:
                ds = lance.dataset(namespace_client=ns, table_id=["db", t], version=version)
                assert value in ds.to_table()["a"].to_pylist()
        # And the restarted server keeps serving writes.
        ds = lance.write_dataset(pa.table({"a": [42]}), namespace_client=ns, table_id=["db", "t0"], mode="append")
        assert 42 in ds.to_table()["a"].to_pylist()
    finally:
        server.stop()
