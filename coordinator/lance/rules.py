"""Lance's commit rules, pure: a table's state and a request in, a verdict out (a value, or a spec-named typed
error). No I/O: what needs the store or the files (a staged manifest's bytes, a listing of `_versions/`) is read
by the service first and handed in. One function per rule of the spec (lance-namespace-rest-catalog.md and the
External Manifest Store); `proposals.py` composes them for the table actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.files import is_below, is_within, unsafe_location

from ..errors import (BadRequest, CoordinatorError, NoSuchTable, Recount, TableExists, Unsupported,
                      VersionExists)
from .layout import (MANIFEST_MAGIC, NAMING_SCHEMES, VERSIONS_DIR, object_path, show, version_of_manifest_name,
                     versions_dir)

if TYPE_CHECKING:
    from .files import FoundManifest
    from .state import LanceTable, TableVersion

Ident = tuple[str, ...]   # namespace levels + table name


# -- identifiers and branches ------------------------------------------------------------------------------------


def check_levels(levels: Ident, what: str) -> None:
    for level in levels:
        # `/` too: a route's %2F is decoded before routing, so a level holding it could never be addressed
        if not level or "\x1f" in level or "\x1e" in level or "\x00" in level or "/" in level:
            raise BadRequest(f"invalid {what} identifier {list(levels)!r}: an empty level, a control character "
                             f"or '/'")


def check_table_ident(ident: Ident) -> None:
    if not ident:
        raise BadRequest("a table identifier needs at least a table name")
    check_levels(ident, "table")


def check_branch(branch: str | None) -> None:
    """Versions live on the main branch only here."""
    if branch not in (None, "", "main"):
        raise Unsupported(f"branch {branch!r}: this server manages the main branch only")


# -- version numbering (CreateTableVersion: put-if-not-exists) ---------------------------------------------------


def same_commit(existing: TableVersion, staging_uri: str, sha256: str | None) -> bool:
    """Whether a create of an existing version is the commit that made it, sent again (same staged path, or a
    byte-identical manifest): answered again then, so a client whose first answer was lost learns it landed."""
    return existing.staging_uri == staging_uri or bool(sha256 and existing.sha256 == sha256)


def check_next_version(state: LanceTable, version: int) -> None:
    """A version not yet in the table must be the next one, `high_water + 1`: a number once recorded (even if its
    record was deleted) is never handed out again, so a reader can never see two manifests under one version.
    Anything else is VersionExists (409, ConcurrentModification: the writer rebases and retries)."""
    if version == 0:
        raise BadRequest("version must be >= 1: Lance versions start at 1")
    if version <= state.high_water and not state.covers(version):
        raise VersionExists(f"version {version} of table {show(state.ident)} already exists; the latest "
                            f"version is {state.high_water}: rebase and retry")
    if version <= state.high_water:
        raise VersionExists(f"version {version} of table {show(state.ident)} was recorded before and its "
                            f"record deleted; version numbers are never reused: the next version is "
                            f"{state.high_water + 1}")
    if version != state.high_water + 1:
        # A writer whose view is ahead of the table: it saw a manifest that was never recorded (a write that
        # bypassed the namespace, or a refused one's). A conflict, so that it rebases on the recorded latest
        # version; and a reload, whose clean-up removes that manifest, or every writer would keep seeing it.
        raise VersionExists(f"version {version} is not the next version of table {show(state.ident)}: the next "
                            f"version is {state.high_water + 1}; rebase and retry", reload=True)


def version_taken(state: LanceTable, version: int) -> VersionExists:
    return VersionExists(f"version {version} of table {show(state.ident)} already exists; the latest version is "
                         f"{state.latest.version}: rebase and retry")


# -- staged manifests --------------------------------------------------------------------------------------------


def check_naming_scheme(scheme: str | None) -> None:
    if scheme is not None and scheme not in NAMING_SCHEMES:
        raise BadRequest(f"naming_scheme must be one of {', '.join(NAMING_SCHEMES)}, got {scheme!r}")


def check_staging_path(location: str, uri: str, version: int) -> str:
    """A staged manifest must sit directly in the table's `_versions/` directory: the server deletes it once the
    version is committed, so it must never be allowed to name a data file, another version's final manifest,
    or anything outside the table. Its file name, when it does."""
    directory = versions_dir(location)
    parent, _, name = uri.rstrip("/").rpartition("/")
    if not name or not (is_within(directory, parent) and is_within(parent, directory)):
        raise BadRequest(f"manifest_path {object_path(uri)!r} must name a file in the table's "
                         f"{VERSIONS_DIR}/ directory ({object_path(directory)}/)")
    final = version_of_manifest_name(name)
    if final is not None and final[0] != version:
        raise BadRequest(f"manifest_path {name!r} is the final manifest of version {final[0]}, not a staged "
                         f"manifest for version {version}")
    return name


def check_staged_manifest(data: bytes, manifest_size: int | None, manifest_path: str) -> None:
    """The staged bytes are the manifest the request describes: its size, and Lance's footer."""
    if manifest_size is not None and manifest_size != len(data):
        raise BadRequest(f"manifest_size {manifest_size} does not match the staged manifest ({len(data)} bytes at "
                         f"{manifest_path})")
    if data[-len(MANIFEST_MAGIC):] != MANIFEST_MAGIC:
        raise BadRequest(f"{manifest_path} is not a Lance manifest (no {MANIFEST_MAGIC!r} footer)")


def check_staged_exists(data: bytes | None, staging_uri: str, version: int) -> bytes:
    if data is None:
        raise BadRequest(f"the staged manifest {staging_uri} does not exist: write it before creating version "
                         f"{version}")
    return data


# -- deleting version records (BatchDeleteTableVersions) ---------------------------------------------------------


def check_counted(state: LanceTable, log_below: int, deletes: int) -> None:
    """Records only in the commit log are counted before the deletion reaches the actor, in a state whose
    `log_below` and `deletes` were these. If versions left memory, or another delete applied, since: nothing
    applies, Recount (the service counts again)."""
    if state.log_below != log_below or state.deletes != deletes:
        raise Recount("the table's versions changed while their records were counted")


# -- declared, registered and deregistered tables ----------------------------------------------------------------


def check_location(warehouse: str, location: str, namespace_dir: str, namespace: Ident, authenticated: bool
                   ) -> str:
    """A client's table location: below the warehouse (never the warehouse itself) and, with authentication on,
    inside the table's namespace's directory: a client's files stay where its namespace grants reach, so
    `create` in one namespace cannot claim another's place."""
    location = location.rstrip("/")
    unsafe = unsafe_location(location)
    if unsafe is not None:
        raise BadRequest(f"location {location!r} is refused: {unsafe}")
    if not location or not is_below(warehouse, location):
        raise BadRequest(f"location {location!r} must be below the warehouse {warehouse!r}")
    if authenticated and not is_below(namespace_dir, location):
        raise BadRequest(f"location {location!r} must lie inside {namespace_dir}, the directory of the namespace "
                         f"{show(namespace) or '(root)'}: with authentication on, a table's files stay where its "
                         f"namespace's grants reach")
    return location


def check_name_free(ident: Ident, taken: bool) -> None:
    if taken:
        raise TableExists(f"Table already exists: {show(ident)}")


def check_declarable(location: str, manifests: list[FoundManifest], foreign: str | None) -> None:
    """A declared table starts with no versions, so the location a client chose for it holds no manifest (a Lance
    table is there: register it), nor any file (`foreign`: one it holds) but those a Lance writer stages ahead of
    the first version (empty directories are no files). Other files there are someone's: a table living there or moved
    away from it (Iceberg's `set-location`: its snapshots still read them), one dropped without purge whose files
    were kept, an Iceberg table's data directory (`write.data.path`), a create about to be committed (a
    stage-create's files); a table declared over them would claim them."""
    if manifests:
        raise BadRequest(f"location {location} already holds a Lance table: register it instead of declaring")
    if foreign is not None:
        raise BadRequest(f"location {location} already holds files that are not a new Lance table's ({foreign}): "
                         f"a declared table starts with nobody else's files, so choose a location that holds none")


def check_registrable(location: str, manifests: list[FoundManifest], latest: bytes | None) -> None:
    """A registered table is one Lance wrote: its `_versions/` holds manifests, the latest (`latest`: its bytes)
    ending in Lance's footer."""
    if not manifests:
        raise BadRequest(f"no Lance table at {location}: its _versions/ directory holds no manifest")
    if not (latest or b"").endswith(MANIFEST_MAGIC):
        raise BadRequest(f"no Lance table at {location}: {manifests[-1].uri} is not a Lance manifest")


# -- batches (BatchCommitTables) ---------------------------------------------------------------------------------


def labelled(exc: CoordinatorError, index: int, label: str) -> CoordinatorError:
    """An operation's error as the batch answers it: naming the operation (its index in the batch)."""
    exc.message = f"operation {index} ({label}): {exc.message}"
    exc.args = (exc.message,)
    return exc


def check_not_removed(index: int, label: str, removed_by: int | None) -> None:
    """Operations apply in request order: a table deregistered by an earlier operation is gone for later ones."""
    if removed_by is not None:
        raise labelled(NoSuchTable(f"the table was deregistered by operation {removed_by} of this batch"), index,
                       label)


def check_deregistrable(index: int, label: str, declared_by: int | None) -> None:
    """Deregistering a table the same batch declares is refused as pointless."""
    if declared_by is not None:
        raise labelled(BadRequest(f"the table is declared by operation {declared_by} of this same batch; leave out "
                                  f"both operations"), index, label)
