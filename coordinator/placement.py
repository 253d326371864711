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

LANCE_REALM = "lance"               # coordinator/lance/namespaces.py REALM (catalog "")
ICEBERG_REALM = "iceberg"           # coordinator/iceberg/state.py REALM (catalog: the prefix, "" for none)
DELTA_MANAGED_DIR = "__unitystorage"   # coordinator/delta/service.py MANAGED_DIR: its managed tables' root


async def check_no_namespace_inside(store, warehouse: str, location: str, iceberg_prefix: str | None = None,
                                    own_root: bool = False) -> None:
    """Refuse `location` (below `warehouse`) if it is, or holds, an existing namespace's directory.
    `iceberg_prefix`: the Iceberg catalog prefix of the table being placed ("" for none; None for a Lance table),
    whose own directory it may lie in; `own_root`: the prefix names a warehouse and `warehouse` is its root, where
    only its namespaces and the Lance namespaces placed in it have directories."""
    segments = location_key(location)[len(location_key(warehouse)) + 1:].split("/")
    own = path_segment(iceberg_prefix) + "~" if iceberg_prefix else None
    first = segments[0]
    if own_root:   # Lance's namespaces of this warehouse share its directories with the prefix's namespaces
        places = [(LANCE_REALM, "", segments), (ICEBERG_REALM, iceberg_prefix, segments)]
    elif first == DELTA_MANAGED_DIR or (first.endswith("~") and first != own):
        raise BadRequest(f"location {location!r} is inside the directory of another Iceberg catalog prefix or of "
                         f"Unity Catalog's managed tables; choose another location")
    elif first == own:
        places = [(ICEBERG_REALM, iceberg_prefix, segments[1:])]
    else:
        places = [(LANCE_REALM, "", segments), (ICEBERG_REALM, "", segments)]
    for realm, catalog, below in places:
        levels = await _levels_of(store, realm, catalog, below) if below else ()
        if levels is not None and (not levels or await store.get_namespace(realm, catalog, join_namespace(levels))
                                   is not None or await store.list_namespaces(
                                       realm, catalog, join_namespace(levels), limit=1, recursive=True)):
            named = ".".join(levels) or f"the catalog prefix {iceberg_prefix!r}"
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
