"""What the store holds of Lance: the realm its names live in (one catalog, ""), its table rows, how a row loads
into the actor's state (restoring and cleaning up its manifests) and is kept while the table is idle."""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.records import TableRow

from ..decision import Compaction
from ..errors import Unavailable
from . import files as lance_files, state as lance_state
from .layout import show
from .state import LanceTable

if TYPE_CHECKING:
    from ..format import Services

REALM = "lance"
CATALOG = ""
FORMAT = "lance"

# An idle table keeps its latest versions only (`LanceTable.dormant`).
COMPACTION = Compaction(compact=LanceTable.dormant, expand=lambda row, state: state)


async def load(services: Services, row: TableRow) -> LanceTable:
    """A table's state from its row and its latest log entries. Its final manifests are restored where missing
    (lance_files.restore_final_manifests), and those above the high-water mark, which were never recorded, removed
    (lance_files.unrecorded_manifests): the actor loads before serving and reloads after every failed write, so
    these are the places to do it. Files for versions above the high-water mark are in our table (a declared
    location must hold no manifests) and were never acknowledged."""
    entries = await services.store.read_log(row.table_id, limit=lance_state.log_entries_to_load(), descending=True)
    state = lance_state.from_row(row, entries)
    await lance_files.restore_final_manifests(services.files, state)
    orphans = await lance_files.unrecorded_manifests(services.files, state, services.config.lance_unrecorded_grace_s)
    if orphans:
        # Wait out a transaction that may still be writing this row (a lost connection): its outcome decides
        # whether these files are orphans. FOR UPDATE blocks until it has committed or rolled back.
        current = await services.store.settled_row_version(row.table_id)
        if current != row.row_version:
            raise Unavailable(f"table {show(state.ident)} changed while it was loading; retry")
        await lance_files.remove_unrecorded(services.files, state, orphans)
    return state
