"""The catalog's side of publishing (the catalog-managed RFC, "Publishing Commits"): which ratified commits of a
table the service copies to `_delta_log/<v>.json` itself, where each copy comes from and goes, and the record
that they are published (`RecordPublished`, decided by the table's actor).

It runs on catalog-managed tables with `maintenance.publish-commits.enabled=true`, or, without that property,
when the service's `maintenance_publish_delta` is on. The content of a ratified commit is immutable, so it does not
matter whether the writer, the service or both publish a version: each copies the same bytes, and a copy is made
only where no file is yet.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from storage.files import join

from ..crossable import crossing
from ..decision import Decision
from . import rules
from .state import DeltaTable

ENABLED = "maintenance.publish-commits.enabled"
# A table the service publishes may hold this many times `delta_max_unpublished_commits` unpublished before a commit
# is refused (429): its writer need not publish, and the service's publishing runs beside the commits, so a writer
# may briefly outrun it. The bound stays, for a publishing that is stuck (a foreign file at a version's place).
SERVICE_SLACK = 10


def enabled(table: DeltaTable, service_default: bool) -> bool:
    if not table.managed or table.last < 0:
        return False
    value = (table.info.get("properties") or {}).get(ENABLED)
    if value is None:
        return service_default
    return str(value).strip().lower() == "true"


def unpublished_limit(table: DeltaTable, max_unpublished: int, service_default: bool) -> int:
    return max_unpublished * SERVICE_SLACK if enabled(table, service_default) else max_unpublished


def log_dir(table: DeltaTable) -> str:
    return join(table.location, "_delta_log")


def due(table: DeltaTable) -> list[tuple[int, str, str]]:
    """The commits to publish, in version order: (version, the ratified staged commit, its published name in
    `_delta_log/`)."""
    staged = join(log_dir(table), "_staged_commits")
    return [(c["version"], join(staged, c["file_name"]), f"{c['version']:020d}.json") for c in table.unpublished]


@dataclass
class RecordPublished:
    """Every version up to `published` is a `_delta_log/<v>.json` now (the service copied them): those commits
    leave the unpublished list, as a writer's own report of its backfill would take them out. An older record
    (the writer reported further meanwhile) changes nothing; it is never a commit of the table's contents."""

    table_id: str
    published: int

    def decide(self, state: Any) -> Decision:
        table = rules.require_table(state, self.table_id)
        if self.published <= table.published:
            return Decision(table, reply=table)
        new = rules.record_published(table, table, self.published)
        return Decision(new, reply=new, row_state=new.row_state())


# What publishing hands a table's owner in a cluster (coordinator/crossable).
crossing(sys.modules[__name__])
