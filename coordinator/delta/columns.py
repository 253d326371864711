"""A table's columns as Unity Catalog `ColumnInfo`s, checked the way Delta checks a schema.

Writers send columns in two shapes. UC's own (`type_name`, `type_text`, `type_json`, as unitycatalog-client and
Delta's UC client send them), and the seed's commit sample: Delta `StructField`s (`{"name", "type",
"nullable"}`, Delta PROTOCOL.md "Schema Serialization Format"). A catalog answers with `ColumnInfo`s whatever it
was sent, since readers build the table's schema from `type_json` / `type_text`, so the second shape is converted.
Names must be present and unique ignoring case: Delta column names are case-insensitive.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from ..errors import BadRequest
from .models import ColumnInfo

# Delta primitive type -> (UC ColumnTypeName, Spark's catalog string, which is UC's `type_text`).
_PRIMITIVES = {
    "string": ("STRING", "string"), "long": ("LONG", "bigint"), "integer": ("INT", "int"),
    "short": ("SHORT", "smallint"), "byte": ("BYTE", "tinyint"), "float": ("FLOAT", "float"),
    "double": ("DOUBLE", "double"), "boolean": ("BOOLEAN", "boolean"), "binary": ("BINARY", "binary"),
    "date": ("DATE", "date"), "timestamp": ("TIMESTAMP", "timestamp"),
    "timestamp_ntz": ("TIMESTAMP_NTZ", "timestamp_ntz"), "variant": ("VARIANT", "variant"),
}
_DECIMAL = re.compile(r"^decimal\(\s*([0-9]{1,2})\s*,\s*([0-9]{1,2})\s*\)$")
_COMPLEX = {"struct": "STRUCT", "array": "ARRAY", "map": "MAP"}
_FIELDS = frozenset(ColumnInfo.model_fields)


def column_infos(columns: list[ColumnInfo], field: str) -> list[dict[str, Any]]:
    """The columns to keep in the catalog entry, in order; `field` names them in errors."""
    out: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    for i, column in enumerate(columns):
        sent = column.to_json()
        name = sent.get("name")
        if not name:
            raise BadRequest(f"{field}[{i}].name is required")
        if name.lower() in seen:
            raise BadRequest(f"{field} has column {seen[name.lower()]!r} twice ({name!r} at position {i}): Delta "
                             f"column names are case-insensitive")
        seen[name.lower()] = name
        info = _from_struct_field(sent, f"{field}[{i}]") if "type" in sent else sent
        info.setdefault("position", i)
        # ColumnInfo's fields only: a key UC does not define is not part of the entry readers get back.
        out.append({k: v for k, v in info.items() if k in _FIELDS})
    return out


def _from_struct_field(sent: dict[str, Any], where: str) -> dict[str, Any]:
    """A Delta StructField as a ColumnInfo; what the writer also spelled out in UC's terms is kept."""
    delta_type = sent["type"]
    nullable = sent.get("nullable", True)
    if not isinstance(nullable, bool):
        raise BadRequest(f"{where}.nullable must be a boolean, got {nullable!r}")
    metadata = sent.get("metadata", {})
    if not isinstance(metadata, dict):
        raise BadRequest(f"{where}.metadata must be an object, got {metadata!r}")
    type_name, precision_scale = _type_name(delta_type, f"{where}.type")
    info = {"type_name": type_name, "type_text": _type_text(delta_type), "nullable": nullable,
            "type_json": orjson.dumps({"name": sent["name"], "type": delta_type, "nullable": nullable,
                                       "metadata": metadata}).decode()}
    if precision_scale is not None:
        info["type_precision"], info["type_scale"] = precision_scale
    if isinstance(metadata.get("comment"), str):
        info["comment"] = metadata["comment"]
    return {**info, **sent}   # (column_infos keeps ColumnInfo's fields only)


def _type_name(delta_type: Any, where: str) -> tuple[str, tuple[int, int] | None]:
    """UC's type name, with (precision, scale) for a decimal; checks nested types all the way down."""
    if isinstance(delta_type, str):
        if delta_type in _PRIMITIVES:
            return _PRIMITIVES[delta_type][0], None
        m = _DECIMAL.match(delta_type)
        if m and 1 <= int(m.group(1)) <= 38 and int(m.group(2)) <= int(m.group(1)):
            return "DECIMAL", (int(m.group(1)), int(m.group(2)))
    elif isinstance(delta_type, dict) and delta_type.get("type") in _COMPLEX:
        kind = delta_type["type"]
        if kind == "struct":
            fields = delta_type.get("fields")
            if not isinstance(fields, list):
                raise BadRequest(f"{where}: a struct type needs a list of fields")
            names: set[str] = set()
            for j, f in enumerate(fields):
                if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
                    raise BadRequest(f"{where}.fields[{j}] needs a name")
                if f["name"].lower() in names:
                    raise BadRequest(f"{where} has field {f['name']!r} twice: Delta column names are "
                                     f"case-insensitive")
                names.add(f["name"].lower())
                _type_name(f.get("type"), f"{where}.fields[{j}].type")
        elif kind == "array":
            _type_name(delta_type.get("elementType"), f"{where}.elementType")
        else:
            _type_name(delta_type.get("keyType"), f"{where}.keyType")
            _type_name(delta_type.get("valueType"), f"{where}.valueType")
        return _COMPLEX[kind], None
    raise BadRequest(f"{where} {delta_type!r} is not a Delta type (a primitive such as 'long' or 'decimal(10,2)', "
                     f"or a struct, array or map object)")


def _type_text(delta_type: Any) -> str:
    """Spark's catalog string for a (checked) Delta type: `bigint`, `array<int>`, `struct<a:int,b:string>`."""
    if isinstance(delta_type, str):
        return _PRIMITIVES[delta_type][1] if delta_type in _PRIMITIVES else delta_type.replace(" ", "")
    kind = delta_type["type"]
    if kind == "struct":
        return "struct<" + ",".join(f"{f['name']}:{_type_text(f['type'])}" for f in delta_type["fields"]) + ">"
    if kind == "array":
        return f"array<{_type_text(delta_type['elementType'])}>"
    return f"map<{_type_text(delta_type['keyType'])},{_type_text(delta_type['valueType'])}>"
