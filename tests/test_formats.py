"""The format seam (coordinator/format.py, api/protocol.py): every format is built the same way and registered
once, the core is given the registered formats and names none, and the import contracts cover every format package
and every core module without anyone having to remember to add them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from api.protocols import PROTOCOLS
from coordinator.config import Config
from coordinator.format import Format
from coordinator.formats import FORMATS
from coordinator.metrics import Metrics
from coordinator.purges import PurgeListing
from coordinator.registry import Registry
from storage.files import DeletionStopped

ROOT = Path(__file__).resolve().parents[1]
COORDINATOR = ROOT / "coordinator"
API = ROOT / "api"

# The modules every format has, each with the same role (docs/development.md, "Adding a format"): `rules` may be a
# package of its own.
FORMAT_MODULES = {"__init__", "models", "state", "rules", "proposals", "service", "files", "rows", "format"}
PROTOCOL_MODULES = {"__init__", "routes", "requests", "errors", "protocol"}
# What a format has beyond them: its own parts, named for what they do (delta/v1: Unity Catalog's Delta API v1.0).
FORMAT_EXTRAS = {"iceberg": {"changes", "cleanup", "expiry", "manifest_lists", "rebase"},
                 "delta": {"columns", "publishing", "v1"}, "lance": {"batch", "layout", "namespaces"}}
PROTOCOL_EXTRAS = {"iceberg": {"endpoints", "idempotency", "uniform"}, "delta": {"v1"}, "lance": set()}
# Packages of the coordinator that are neither a format nor the core: UniForm joins two formats (above both).
NOT_CORE = {"uniform", "maintenance"}   # above the formats they join, as the layers contract says
# The registration, and the coordinator as one object, which wires the registered formats.
WIRING = {"formats", "service"}


def _modules(package: Path) -> set[str]:
    return {p.stem for p in package.glob("*.py")} | {p.name for p in package.iterdir()
                                                        if p.is_dir() and (p / "__init__.py").exists()}


def _format_packages() -> set[str]:
    """The coordinator's subpackages that declare a format (a `format.py`), registered or not."""
    return {p.parent.name for p in COORDINATOR.glob("*/format.py")}


def _contracts() -> dict[str, dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {c["type"] + ":" + c.get("containers", ["-"])[0]: c for c in config["tool"]["importlinter"]["contracts"]}


def test_every_format_package_is_registered_once_with_its_protocol():
    assert {f.name for f in FORMATS} == _format_packages()
    for fmt in FORMATS:
        assert isinstance(fmt, Format) and fmt.grants.shape.split("/")[0] == fmt.name
        assert all(change.startswith(fmt.name + ".") for change in fmt.changes), fmt.changes
        assert set(fmt.settings) <= set(Config.__dataclass_fields__), "its settings are fields of the Config"
    assert [p.format for p in PROTOCOLS] == list(FORMATS), "one protocol for each registered format, in order"
    assert {p.name for p in PROTOCOLS} == {p.name for p in API.iterdir() if (p / "protocol.py").exists()}


def test_every_format_has_the_same_modules_with_the_same_roles():
    for fmt in FORMATS:
        found = _modules(COORDINATOR / fmt.name)
        assert found == FORMAT_MODULES | FORMAT_EXTRAS[fmt.name], (fmt.name, found ^ FORMAT_MODULES)
        found = _modules(API / fmt.name)
        assert found == PROTOCOL_MODULES | PROTOCOL_EXTRAS[fmt.name], (fmt.name, found ^ PROTOCOL_MODULES)


def test_the_import_contracts_cover_every_format_package_and_every_core_module():
    contracts = _contracts()
    packages = {f"coordinator.{name}" for name in _format_packages()}
    assert set(contracts["independence:-"]["modules"]) == packages, "the formats know nothing of one another"
    core = contracts["forbidden:-"]
    assert set(core["forbidden_modules"]) == packages
    expected = {f"coordinator.{name}" for name in _modules(COORDINATOR) - {"__init__"} - WIRING - NOT_CORE
                - _format_packages()}
    assert set(core["source_modules"]) == expected, "every core module is held to knowing no format"
    layers = contracts["layers:coordinator"]["layers"]
    format_layer = next(layer for layer in layers if set(_format_packages()) & set(layer.split(" | ")))
    assert _format_packages() <= set(format_layer.split(" | ")), format_layer


def test_metrics_count_the_commits_of_a_format_they_were_not_told_of():
    metrics = Metrics(("known",))
    metrics.observe_commit("known", "applied", 0.01)
    metrics.observe_commit("new", "conflict", 0.02)
    metrics.observe_commit("new", "conflict", None)
    snapshot = metrics.snapshot()
    assert snapshot["known"]["applied"] == 1 and snapshot["known"]["conflict"] == 0
    assert snapshot["new"]["conflict"] == 2 and snapshot["new"]["latency_count"] == 1
    assert b'coordinator_commits_total{format="new",outcome="conflict"} 2.0' in metrics.render()



def test_no_module_is_too_long_to_read():
    """At most 500 lines in coordinator/ and storage/, 400 in api/."""
    for top, limit in (("coordinator", 500), ("storage", 500), ("api", 400)):
        for path in (ROOT / top).rglob("*.py"):
            name = str(path.relative_to(ROOT))
            lines = len(path.read_text().splitlines())
            assert lines <= limit, f"{name} has {lines} lines (at most {limit})"


def test_a_purge_claim_is_listed_by_the_one_format_that_claims_it():
    """Purge listings are kept by format (a third format's never replaces another's); a claim no format claims, or
    that two would, deletes nothing: never the whole tree, which may hold files the table does not own."""
    registry = Registry(Config(), None, None, Metrics())
    registry.register_purge_listing("dirs", PurgeListing(lambda named: named.endswith("/"), lambda *a: ["d"]))
    registry.register_purge_listing("files", PurgeListing(lambda named: named.endswith(".json"), lambda *a: ["f"]))
    assert registry.purge_listing(None, "loc", "loc/_versions/") == ["d"]
    assert registry.purge_listing(None, "loc", "loc/metadata/v1.json") == ["f"]
    with pytest.raises(DeletionStopped, match="no format"):
        registry.purge_listing(None, "loc", "loc/other")
    registry.register_purge_listing("json-dirs", PurgeListing(lambda named: ".json" in named, lambda *a: ["j"]))
    with pytest.raises(DeletionStopped, match="several formats"):
        registry.purge_listing(None, "loc", "loc/metadata/v1.json")
