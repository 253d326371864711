"""The proposals Unity Catalog's Delta API v1.0 hands a Delta table's actor: the same actor, state and commit log as
the preview API's (coordinator/delta/proposals.py), so a table has one history whichever API commits to it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from storage.records import LogEntry

from ...decision import Decision
from ...errors import Forbidden, NoSuchTable
from ...name_limits import check_table_key
from ..proposals import CreateFromStaging, feed_change
from ..rules import FullName, table_named
from ..state import DeltaTable, StagingTable, freeze
from . import rules
from .models import UpdateTable as UpdateRequest


def _creator_only(staging: StagingTable, caller: str) -> None:
    """The spec: only the principal that created a staging table may get its credentials or finalize it."""
    if staging.created_by is not None and staging.created_by != caller:
        raise Forbidden(f"staging table {staging.table_id} was created by another principal: only its creator may "
                        f"use it")


@dataclass
class StagingLocation:
    """A staging table's location, for its creator (getStagingTableCredentials)."""

    table_id: str
    caller: str

    def decide(self, state: Any) -> Decision:
        if not isinstance(state, StagingTable):
            raise NoSuchTable(f"Staging table does not exist: {self.table_id}")
        _creator_only(state, self.caller)
        return Decision(state, reply=state.location)


@dataclass
class CreateFromStagingV1(CreateFromStaging):
    """createTable: the preview API's creation from a staging table, by the staging table's creator, with what
    v1 declares besides (`extra`: protocol, domain metadata, partition columns, UniForm)."""

    extra: dict[str, Any] | None = None

    def decide(self, state: Any) -> Decision:
        if isinstance(state, StagingTable):
            _creator_only(state, self.owner)
        decision = super().decide(state)
        table = decision.state
        table = replace(table, info=freeze({**table.info, **(self.extra or {})}))
        return replace(decision, state=table, reply=table, row_state=table.row_state())


@dataclass
class UpdateTable:
    """updateTable: every requirement and update of one request, decided together (rules.decide_update)."""

    full: FullName
    request: UpdateRequest
    max_unpublished: int
    now_ms: int

    @property
    def counts_as_commit(self) -> bool:   # counted and timed per outcome (/metrics), as the preview's commits are
        return "add-commit" in self.request.updates

    def decide(self, state: Any) -> Decision:
        table = table_named(state, self.full)
        new = rules.decide_update(table, self.request, max_unpublished=self.max_unpublished, now_ms=self.now_ms)
        if new is table:
            return Decision(table, reply=table)
        if new.last == table.last:   # a backfill or a change of the catalog's own metadata: no new version
            return Decision(new, reply=new, row_state=new.row_state())
        return Decision(new, reply=new, row_state=new.row_state(), log=[LogEntry(new.last, new.newest)],
                        changes=[feed_change("committed", new)])


@dataclass
class RenameTable:
    """renameTable, within its schema: the row moves to the new name (the store's unique name index is the
    compare-and-set against a table created there meanwhile)."""

    full: FullName
    new_name: str
    now_ms: int
    caller: str

    def decide(self, state: Any) -> Decision:
        table: DeltaTable = table_named(state, self.full)
        to = (self.full[0], self.full[1], self.new_name)
        check_table_key(*to)
        info = freeze({**table.info, "name": self.new_name, "updated_at": self.now_ms, "updated_by": self.caller})
        new = replace(table, info=info)
        return Decision(new, reply=new, row_state=new.row_state(), rename=to)
