"""Each protocol's OpenAPI document is served (`GET /openapi/<name>.yaml`, issue 7), and the Unity Catalog one lists
exactly the routes the service serves."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml

from api.app import OPENAPI_DOCUMENTS, create_app
from coordinator.config import Config
from coordinator.service import Coordinator

# In CI the clone has shared/ beside it; the reference specs are there.
SPECS = Path(__file__).resolve().parents[2] / "shared" / "specs"
REFERENCE = {"iceberg": "iceberg-rest-catalog-open-api.yaml", "lance": "lance-namespace-rest-open-api.yaml"}


def test_each_protocol_has_its_document(service):
    for name in OPENAPI_DOCUMENTS:
        r = httpx.get(f"{service}/openapi/{name}.yaml")
        assert r.status_code == 200, r.text
        assert r.headers["content-type"] == "application/yaml"
        doc = yaml.safe_load(r.text)
        assert doc["openapi"].startswith("3.") and doc["paths"], name
        if name in REFERENCE and (SPECS / REFERENCE[name]).exists():
            assert r.content == (SPECS / REFERENCE[name]).read_bytes(), f"{name}.yaml is not the reference spec"
    r = httpx.get(f"{service}/openapi/nope.yaml")
    assert r.status_code == 404 and r.json()["error"]["code"] == 404
    # Service routes: none of them is taken for an Iceberg or Lance route.
    assert httpx.get(f"{service}/v1/openapi/iceberg.yaml").json()["error"]["type"] == "NotFoundException"


def test_the_unity_catalog_document_lists_exactly_the_served_routes():
    app = create_app(Coordinator(Config()))
    prefix = "/api/2.1/unity-catalog"
    served = set()
    for rule in app.url_map.iter_rules():
        # (the catch-all answers ENDPOINT_NOT_FOUND; the Iceberg mount is Iceberg's spec, /openapi/iceberg.yaml; the
        # Delta API v1.0 is its own spec's, checked by tests/delta/test_delta_v1_api.py)
        if (rule.rule.startswith(prefix) and "<path:" not in rule.rule and not rule.rule.startswith(prefix + "/iceberg/")
                and not rule.rule.startswith(prefix + "/delta/v1/")):
            path = rule.rule.removeprefix(prefix).replace("<", "{").replace(">", "}")
            served |= {(method, path) for method in rule.methods - {"HEAD", "OPTIONS"}}
    doc = yaml.safe_load((Path(__file__).resolve().parents[1] / "api" / "openapi" / "delta.yaml").read_text())
    documented = {(method.upper(), path) for path, item in doc["paths"].items() for method in item
                  if method != "parameters"}
    assert documented == served
