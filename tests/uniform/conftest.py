"""Fixtures of the UniForm suites: the Unity Catalog client and a pyiceberg catalog on the Iceberg mount."""

from __future__ import annotations

import pytest
from pyiceberg.catalog.rest import RestCatalog

from tests.delta.conftest import UC

MOUNT = "/api/2.1/unity-catalog/iceberg"


def iceberg_catalog(base_url: str, warehouse: str = "main", **props) -> RestCatalog:
    """pyiceberg reading Unity Catalog's Delta tables as Iceberg, connected as the docs say."""
    return RestCatalog("uc", uri=base_url + MOUNT, warehouse=warehouse, **props)


@pytest.fixture
def uc(service) -> UC:
    client = UC(service)
    yield client
    client.http.close()


def wait_converted(catalog: RestCatalog, name: str, version: int, timeout_s: float = 60.0):
    """The Iceberg table once it shows Delta version `version` (the service converts after the commit)."""
    import time

    from pyiceberg.exceptions import NoSuchTableError, RESTError
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        try:
            table = catalog.load_table(name)
            seen = int(table.properties.get("delta-version", -1))
            if seen >= version:
                assert seen == version, f"{name} shows Delta version {seen}, beyond {version}"
                return table
        except (NoSuchTableError, RESTError) as exc:   # not converted yet; or an earlier version was refused
            seen = f"{type(exc).__name__}: {exc}"
        time.sleep(0.1)
    raise AssertionError(f"{name} did not reach Delta version {version} in {timeout_s} s (last seen: {seen})")


def duckdb_catalog(base_url: str, warehouse: str = "main"):
    """DuckDB 1.4 with its iceberg extension attached to the mount as `uc`: the extensions come from the PyPI wheels
    (`duckdb-ext-*`), installed under site-packages/duckdb_ext/extensions; nothing is downloaded."""
    import importlib.util

    import duckdb
    extensions = list(importlib.util.find_spec("duckdb_ext").submodule_search_locations)[0] + "/extensions"
    con = duckdb.connect()
    con.execute(f"SET extension_directory = '{extensions}'")
    con.execute("SET autoinstall_known_extensions = false")
    for extension in ("parquet", "avro", "httpfs", "iceberg"):
        con.execute(f"LOAD {extension}")
    con.execute(f"ATTACH '{warehouse}' AS uc (TYPE iceberg, ENDPOINT '{base_url}{MOUNT}', "
                f"AUTHORIZATION_TYPE 'none')")
    return con
