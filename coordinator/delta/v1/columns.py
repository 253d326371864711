"""Columns as Unity Catalog's Delta API v1.0 sends them (`DeltaStructType`) and as the catalog keeps them (UC
`ColumnInfo`s whose `type_json` is the Delta log's StructField, coordinator/delta/columns.py), both ways.

The two spell nested types differently: the API hyphenates (`element-type`, `contains-null`, `key-type`,
`value-type`, `value-contains-null`), the Delta log (PROTOCOL.md "Schema Serialization Format") writes camelCase.
One table is one set of columns whichever API wrote it, so each API's shape is converted at its edge."""

from __future__ import annotations

from typing import Any

import orjson

from ..columns import column_infos
from ..models import ColumnInfo
from .errors import MalformedRequest
from .models import model

# API key -> Delta log key, for nested types.
_TO_LOG = {"element-type": "elementType", "contains-null": "containsNull", "key-type": "keyType",
           "value-type": "valueType", "value-contains-null": "valueContainsNull"}
_TO_WIRE = {log: wire for wire, log in _TO_LOG.items()}


def _convert_type(value: Any, keys: dict[str, str]) -> Any:
    if not isinstance(value, dict):
        return value   # a primitive ("long", "decimal(10,2)"), or something column_infos refuses by name
    out = {keys.get(k, k): v for k, v in value.items()}
    for key in ("elementType", "keyType", "valueType", "element-type", "key-type", "value-type"):
        if key in out:
            out[key] = _convert_type(out[key], keys)
    if isinstance(out.get("fields"), list):
        out["fields"] = [_convert_field(f, keys) for f in out["fields"]]
    return out


def _convert_field(field: Any, keys: dict[str, str]) -> Any:
    if not isinstance(field, dict):
        return field
    return {**field, "type": _convert_type(field.get("type"), keys)}


def column_infos_of(fields: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """A `DeltaStructType`'s fields as the catalog keeps them (checked as coordinator/delta/columns.py checks
    any schema). Each field's name, type, nullable and metadata are required (the spec's DeltaStructField)."""
    infos = []
    for i, field in enumerate(fields):
        if not isinstance(field, dict):
            raise MalformedRequest(f"{where}.fields[{i}] must be an object")
        missing = [k for k in ("name", "type", "nullable", "metadata") if k not in field]
        if missing:
            raise MalformedRequest(f"{where}.fields[{i}] lacks {', '.join(missing)}")
        log_field = _convert_field({k: field[k] for k in ("name", "type", "nullable", "metadata")}, _TO_LOG)
        infos.append(model(ColumnInfo, log_field, f"{where}.fields[{i}]"))
    return column_infos(infos, f"{where}.fields")


def struct_of(columns: list[dict[str, Any]]) -> dict[str, Any]:
    """The catalog's columns as a `DeltaStructType`, from each column's Delta StructField (`type_json`)."""
    fields = []
    for c in columns:
        raw = c.get("type_json")
        if raw:
            f = orjson.loads(raw)
        else:   # written by a client that sent no type_json: its type as text is all there is
            f = {"name": c.get("name"), "type": c.get("type_text") or "string"}
        f.setdefault("nullable", c.get("nullable", True))
        f.setdefault("metadata", {})
        fields.append(_convert_field(f, _TO_WIRE))
    return {"type": "struct", "fields": fields}
