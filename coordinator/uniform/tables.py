"""Which Iceberg metadata a Delta table offers, if any: the rules, as pure functions of the table's state.

A Delta table is readable as Iceberg (UniForm) from one of two sources:

- its writer's conversion: Delta 4.3+ converts before it commits and sends the result with the commit
  (`uniform.iceberg`, kept in the catalog entry by `coordinator.delta.rules.check_uniform`);
- the service's own conversion (`DeltaTable.converted`, written by `coordinator.uniform.converter`), for a table
  whose properties enable UniForm Iceberg and whose writers send no `uniform` block (delta-rs, Kernel-based ones).

A writer's conversion of the latest ratified version is served as it is; otherwise a table the service converts is
served from the service's conversion; otherwise a writer's older conversion is still served, as Unity Catalog
serves the last one a writer sent. Each shows a version the Delta table has: never one it does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from coordinator.delta import DeltaTable
from coordinator.errors import NoSuchTable, Unsupported

# Delta's table properties (PROTOCOL.md, "Iceberg Compatibility V2" and "Column Mapping"; Delta's UniversalFormat)
ENABLED_FORMATS = "delta.universalFormat.enabledFormats"
ICEBERG_COMPAT_V2 = "delta.enableIcebergCompatV2"
COLUMN_MAPPING_MODE = "delta.columnMapping.mode"

# The Iceberg table properties each converted snapshot carries (Delta's IcebergConverter names them so too).
DELTA_VERSION = "delta-version"
DELTA_TIMESTAMP = "delta-timestamp"
BASE_DELTA_VERSION = "base-delta-version"


@dataclass(frozen=True)
class Served:
    """The Iceberg metadata a table is read from: its file, the Delta version it converts, and who wrote it."""

    metadata_location: str
    delta_version: int
    by: str   # "writer" (the seed's `uniform.iceberg`) or "service"


def _true(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "true"   # Delta reads booleans case-insensitively


def iceberg_enabled(properties: Mapping[str, str]) -> bool:
    """UniForm Iceberg is asked for: `delta.universalFormat.enabledFormats` names `iceberg`."""
    formats = properties.get(ENABLED_FORMATS) or ""
    return "iceberg" in (f.strip().lower() for f in formats.split(","))


def why_not_convertible(properties: Mapping[str, str]) -> str | None:
    """Why a table that asks for UniForm Iceberg cannot be converted by its properties alone (None: it can). Delta
    requires IcebergCompatV2 with column mapping for it: the column-mapping ids become Iceberg's field ids, so the
    Parquet files' columns are found by id whatever they are named."""
    missing = []
    if not _true(properties.get(ICEBERG_COMPAT_V2)):
        missing.append(f"{ICEBERG_COMPAT_V2} = true")
    if (properties.get(COLUMN_MAPPING_MODE) or "none").strip().lower() not in ("name", "id"):
        missing.append(f"{COLUMN_MAPPING_MODE} = name or id (found {properties.get(COLUMN_MAPPING_MODE)!r})")
    if missing:
        return f"UniForm Iceberg needs {' and '.join(missing)}"
    return None


def writer_conversion(table: DeltaTable) -> Mapping[str, Any] | None:
    """The `uniform.iceberg` of the last commit that carried one (the seed's fields), if any."""
    uniform = table.info.get("uniform")
    return uniform.get("iceberg") if isinstance(uniform, Mapping) else None


def service_converts(table: DeltaTable) -> bool:
    """The service converts the table itself: a catalog-managed table whose properties ask for UniForm Iceberg and
    whose latest commit did not bring its writer's own conversion."""
    if not table.managed or not iceberg_enabled(table.info.get("properties") or {}):
        return False
    writer = writer_conversion(table)
    return writer is None or writer.get("converted_delta_version") != table.last


def served(table: DeltaTable) -> Served:
    """The Iceberg metadata `table` is read from now; NoSuchTable if it has none, Unsupported (with the reason) if
    the service cannot convert it."""
    name = ".".join(table.full_name)
    writer = writer_conversion(table)
    if writer is not None and not service_converts(table):
        return Served(writer["metadata_location"], writer["converted_delta_version"], "writer")
    if service_converts(table):
        refusal = why_not_convertible(table.info.get("properties") or {})
        converted = table.converted or {}
        refused = converted.get("refused")
        if refusal is None and refused is not None:
            refusal = f"Delta version {refused['version']} cannot be converted to Iceberg: {refused['reason']}"
        if refusal is not None:
            raise Unsupported(f"{name} cannot be read as Iceberg: {refusal}. The Delta table itself is unaffected; "
                              f"read it through Unity Catalog's Delta API")
        if "metadata_location" in converted:
            return Served(converted["metadata_location"], converted["delta_version"], "service")
        if writer is not None:   # a writer's older conversion, until the service's first one
            return Served(writer["metadata_location"], writer["converted_delta_version"], "writer")
        raise NoSuchTable(f"Table does not exist: {name} has no Iceberg metadata yet (its first conversion to "
                          f"Iceberg is under way); retry shortly")
    raise NoSuchTable(f"Table does not exist: {name} is a Delta table without Iceberg metadata (UniForm Iceberg "
                      f"is not enabled: set {ENABLED_FORMATS} = iceberg)")


def has_iceberg(table: DeltaTable) -> bool:
    """Whether a listing shows the table: it has Iceberg metadata to read (or a refusal to explain)."""
    try:
        served(table)
    except NoSuchTable:
        return False
    except Unsupported:
        return True
    return True
