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

