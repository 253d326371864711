"""How long a name may be, in every protocol: one limit, checked where names are created.

PostgreSQL cannot index a key over ~2.7 KB, and a table's key is its catalog, namespace and name together: a
longer one would fail deep inside a commit, for every request batched with it, and a retry could never succeed.
Real catalogs use a few dozen bytes (Unity Catalog and Hive allow 255 characters; Polaris and Glue about as
much), so the limits sit far below the index's, in bytes of UTF-8 (what the index counts).
"""

from __future__ import annotations

from typing import Iterable

from storage.records import NAMESPACE_SEP

from .errors import BadRequest

NAME_MAX_BYTES = 255          # a table's, view's, catalog's or one namespace level's name
NAMESPACE_MAX_LEVELS = 16
NAMESPACE_MAX_BYTES = 1024    # all of a namespace's levels together


def check_name(kind: str, name: str) -> None:
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > NAME_MAX_BYTES:
        raise BadRequest(f"{kind} name is {size} bytes long; names may be at most {NAME_MAX_BYTES} bytes of UTF-8")


def check_namespace(levels: Iterable[str]) -> None:
    levels = list(levels)
    if len(levels) > NAMESPACE_MAX_LEVELS:
        raise BadRequest(f"namespace has {len(levels)} levels; at most {NAMESPACE_MAX_LEVELS} are allowed")
    for level in levels:
        check_name("namespace level", level)
    size = sum(len(level.encode("utf-8", "surrogatepass")) for level in levels)
    if size > NAMESPACE_MAX_BYTES:
        raise BadRequest(f"namespace is {size} bytes long; a namespace's levels together may be at most "
                         f"{NAMESPACE_MAX_BYTES} bytes of UTF-8")


def check_table_key(catalog: str, namespace: str, name: str) -> None:
    """A table row's whole key, as the store holds it (levels joined by NAMESPACE_SEP)."""
    if catalog:
        check_name("catalog", catalog)
    check_namespace(namespace.split(NAMESPACE_SEP) if namespace else [])
    check_name("table", name)
