"""The proposals a Delta table's actor decides (`decide(state) -> Decision`): thin glue between a request and the
rules in `rules.py`, which say what is accepted and what the table becomes."""

from __future__ import annotations

import functools
import sys
import uuid
from dataclasses import dataclass
from typing import Any

from storage.files import join
from storage.records import LogEntry, PurgeClaim

from ..crossable import crossing
from ..decision import Change, Decision
from ..name_limits import check_table_key
from ..purges import delete_own_location
from . import models as _models, publishing, rules, state as _state
from .models import CommitRequest, GetCommitsRequest, MetricsRequest
from .rows import FORMAT, REPORTS
from .rules import FullName
from .state import DeltaTable, StagingTable, freeze, table_info


@dataclass
class LoadTable:
    full: FullName

    def decide(self, state: Any) -> Decision:
        return Decision(state, reply=rules.table_named(state, self.full))


async def _forget_dropped(store, files, table_id: uuid.UUID, claim: PurgeClaim | None) -> None:
    """After a drop is durable: its metrics go, and a MANAGED table's files too. Seed: a managed table's
    "lifecycle (including deletion of files when dropped)" is the catalog's; an EXTERNAL table's files are the
    user's. A managed location is the table's own directory under the managed root (handed out by
    /staging-tables), so nothing else lives below it."""
    await store.delete_reports(REPORTS, table_id)
    if claim is not None:
        await delete_own_location(store, files, claim.location, claim.owner)


@dataclass
class DropTable:
    full: FullName
    store: Any = None
    files: Any = None

    def decide(self, state: Any) -> Decision:
        table = rules.table_named(state, self.full)
        managed = table.location if table.info["table_type"] == "MANAGED" else None
        # A partial of a module function, not a closure: in a cluster the proposal may travel to the table's owner
        # (coordinator/cluster/channel.py).
        claim = PurgeClaim(managed, uuid.uuid4()) if managed is not None else None
        cleanup = functools.partial(_forget_dropped, self.store, self.files, table.table_id, claim)
        return Decision(None, delete=True, after_durable=cleanup, purge=claim, changes=[feed_change("dropped", table)])


@dataclass
class CheckStaging:
    full: FullName
    location: str
    schema_id: str

    def decide(self, state: Any) -> Decision:
        return Decision(state, reply=rules.unused_staging(state, self.full, self.location, self.schema_id))


@dataclass
class CreateFromStaging:
    """`POST /tables` for a MANAGED DELTA table: the staging row becomes the table at version 0."""

    full: FullName
    location: str
    schema_id: str
    first_commit: dict[str, Any]
    columns: list[dict[str, Any]]
    comment: str | None
    properties: dict[str, str]
    now_ms: int
    owner: str   # the caller (read in the request: the actor runs outside it)

    def decide(self, state: Any) -> Decision:
        check_table_key(*self.full)
        staging = rules.unused_staging(state, self.full, self.location, self.schema_id)
        info = table_info(staging.table_id, self.full, "MANAGED", "DELTA", self.columns, staging.location,
                          self.comment, self.properties, self.now_ms, self.owner)
        table = DeltaTable(staging.table_id, freeze(info), last=0, published=0, unpublished=(),
                           newest=self.first_commit)
        return Decision(table, reply=table, row_state=table.row_state(), log=[LogEntry(0, self.first_commit)],
                        rename=self.full, changes=[feed_change("created", table)])


@dataclass
class Commit:
    counts_as_commit = True  # a change to the table's contents: counted and timed per outcome (/metrics)
    request: CommitRequest
    max_unpublished: int
    now_ms: int
    service_publishes: bool = False   # the service's `maintenance_publish_delta`: see publishing.unpublished_limit

    def decide(self, state: Any) -> Decision:
        table = rules.require_table(state, self.request.table_id)
        limit = publishing.unpublished_limit(table, self.max_unpublished, self.service_publishes)
        new = rules.decide_commit(table, self.request, max_unpublished=limit, now_ms=self.now_ms)
        if new is table:
            return Decision(table)
        if new.last == table.last:   # a backfill reported: no new version, nothing for the feed
            return Decision(new, row_state=new.row_state())
        return Decision(new, row_state=new.row_state(), log=[LogEntry(new.last, new.newest)],
                        changes=[feed_change("committed", new)])


@dataclass
class Current:
    """The table as its actor holds it, by id (the service's Iceberg conversion reads its versions from it)."""

    table_id: str

    def decide(self, state: Any) -> Decision:
        return Decision(state, reply=rules.require_table(state, self.table_id))


@dataclass
class RecordConversion:
    """The service's conversion to Iceberg (coordinator/uniform) reached `record["delta_version"]` (or refused a
    version): kept in the table's row, so that every member serves it and a restart resumes from it. Not a commit
    of the table's contents: its Delta versions do not change."""

    table_id: str
    base: str | None        # the metadata file the conversion started from
    record: dict[str, Any]

    def decide(self, state: Any) -> Decision:
        new = rules.record_conversion(rules.require_table(state, self.table_id), self.base, self.record)
        return Decision(new, row_state=new.row_state())


@dataclass
class GetCommits:
    request: GetCommitsRequest
    page_size: int

    def decide(self, state: Any) -> Decision:
        table = rules.require_table(state, self.request.table_id)
        r = self.request
        return Decision(table, reply=rules.commits_page(table, r.table_uri, r.start_version, r.end_version,
                                                        self.page_size))


@dataclass
class CheckMetrics:
    request: MetricsRequest

    def decide(self, state: Any) -> Decision:
        rules.check_metrics(rules.require_table(state, self.request.table_id), self.request)
        return Decision(state)


@dataclass
class Locate:
    """Where a table keeps its files; a staging table's too, since its writer fills it before the table is made
    (the spec: credentials "as though the staging table were a regular table")."""

    table_id: str

    def decide(self, state: Any) -> Decision:
        if isinstance(state, StagingTable):
            return Decision(state, reply=state.location)
        return Decision(state, reply=rules.require_table(state, self.table_id).location)


def feed_change(what: str, table: DeltaTable) -> Change:
    """The commit feed's `delta.table.<what>`: the table's latest ratified version (null while the catalog
    coordinates none: an EXTERNAL table) and that commit's file."""
    data: dict[str, Any] = {"format": FORMAT, "version": table.last if table.last >= 0 else None}
    if table.newest is not None and table.newest["version"] == table.last:
        staged = "_delta_log" if table.last == 0 else "_delta_log/_staged_commits"   # 0.json is published at once
        data["commit-file"] = join(table.location, staged, table.newest["file_name"])
    return Change(f"{FORMAT}.table.{what}", data)


# What a Delta request carries to its table's owner in a cluster, and the owner's answers (coordinator/crossable).
crossing(sys.modules[__name__], _models, _state)
