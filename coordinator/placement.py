"""A location a client chooses for a table may not be a namespace's directory, nor hold one (and a namespace
may not be made where its directory would lie in a table's location).

Tables placed by default go to `<namespace directory>/<name>-<uuid>`, Iceberg's and Lance's alike (an Iceberg
catalog prefix's namespaces below `<warehouse>/<prefix>~`). A table at or above a namespace's directory overlaps
every table later placed there by default, so the namespace could take no new table: the create that chose such a
place is the one to refuse. Lance namespaces and unprefixed Iceberg namespaces share the warehouse's directories,
so both are looked up; a prefix's directory and Unity Catalog's managed root belong to their catalog alone.
"""

from __future__ import annotations

from storage.files import location_key, path_segment
from storage.records import join_namespace, split_namespace

from .errors import BadRequest
from .format import Formats


async def check_no_namespace_inside(store, formats: Formats, warehouse: str, location: str,
                                    own: tuple[str, str] | None = None, own_root: str | None = None) -> None:
    """Refuse `location` (below `warehouse`) if it is, or holds, an existing namespace's directory, of any format
    (each format's `Directories` say where its namespaces have them). `own`: the realm and catalog of the table
    being placed, whose catalog may have a directory of its own there, which the table may lie in (an Iceberg catalog
    prefix's); `own_root`: `warehouse` is the root of the named warehouse `own_root`, where only the namespaces the
    formats place in that warehouse have directories."""
    segments = location_key(location)[len(location_key(warehouse)) + 1:].split("/")
    first = segments[0]
    placing = [f for f in formats if f.directories is not None]
    own_format = formats.by_realm[own[0]] if own is not None else None
    own_directory = (own_format.directories.own_directory(own[1])
                     if own_format is not None and own_format.directories is not None else None)
    if own_root is not None:
        places = [(f, catalog, segments) for f in placing
                  if (catalog := f.directories.top_catalog(own_root)) is not None]
    elif own_directory is not None and first == own_directory:
        places = [(own_format, own[1], segments[1:])]
    elif any(f.directories.reserves(first) for f in placing):
        reserved = " or of ".join(f.directories.reserved_for for f in placing if f.directories.reserved_for)
        raise BadRequest(f"location {location!r} is inside the directory of {reserved}; choose another location")
    else:
        places = [(f, catalog, segments) for f in placing if (catalog := f.directories.top_catalog(None)) is not None]
    for fmt, catalog, below in places:
        realm = fmt.realm
        levels = await _levels_of(store, realm, catalog, below) if below else ()
        if levels is not None and (not levels or await store.get_namespace(realm, catalog, join_namespace(levels))
                                   is not None or await store.list_namespaces(
                                       realm, catalog, join_namespace(levels), limit=1, recursive=True)):
            named = ".".join(levels) or f"the {fmt.catalog_called} {catalog!r}"
            raise BadRequest(f"location {location!r} is the directory of namespace {named}, or contains a "
                             f"namespace's directory: its tables are placed there; choose another location")


async def check_namespace_directory_free(store, directory: str, name: str) -> None:
    """The other way round: a new namespace's directory may not lie at or inside a table's location (one a client
    chose before the namespace existed), where every table placed in the namespace by default would overlap it."""
    if await store.location_taken(directory, below=False):
        raise BadRequest(f"the directory of namespace {name}, {directory}, lies within a table's location (or one "
                         f"still being deleted); move or drop that table first, or choose another name")


async def _levels_of(store, realm: str, catalog: str, segments: list[str]) -> tuple[str, ...] | None:
    """The namespace levels whose directories (`path_segment`) are these segments, or None if no namespace has
    them. A plain segment is its own level; a cleaned one (`a_b~hash`) is found among the children."""
    levels: tuple[str, ...] = ()
    for segment in segments:
        if segment and path_segment(segment) == segment:
            levels += (segment,)
            continue
        children = await store.list_namespaces(realm, catalog, join_namespace(levels))
        found = [split_namespace(c)[-1] for c in children if path_segment(split_namespace(c)[-1]) == segment]
        if not found:
            return None
        levels += (found[0],)
    return levels
