"""BatchCommitTables (and BatchCreateTableVersions): several operations across tables, applied in request order
and atomically, through the core's multi-table transaction. Planned here with the service's public methods only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..decision import NewTable, Proposal
from ..errors import BadRequest, NoSuchNamespace, NoSuchTable, NotFound, TableExists
from . import rules
from .files import show
from .proposals import DeleteVersions, RemoveTable, Steps, feed_change
from .rules import Ident
from .state import LanceTable

if TYPE_CHECKING:
    from storage.records import TableRow

    from .service import LanceService, TableRef


async def commit_batch(service: LanceService, operations: list[tuple[str, Ident, Any]]) -> list[tuple[str, Any]]:
    """Every operation (kind, table identifier, spec request) applied, or none; (kind, reply) in request order."""
    ops = [Op(kind, tuple(ident), request) for kind, ident, request in operations]
    try:
        return await Batch(service, ops).run()
    except _StaleName:
        # A cached name whose table has gone (dropped, maybe declared again): forget and plan once more.
        for op in ops:
            service.forget(op.ident)
    try:
        return await Batch(service, ops).run()
    except _StaleName:
        raise NoSuchTable("a table of this batch was dropped while the batch was being applied; nothing was "
                          "applied") from None


class _StaleName(Exception):
    """An actor found its table gone although the batch had just resolved its name."""


@dataclass
class Op:
    kind: str            # one of models.OPERATION_KINDS
    ident: Ident
    request: Any

    @property
    def label(self) -> str:
        return f"{self.kind} {show(self.ident)}"


@dataclass
class Target:
    """One table as the batch sees it: an existing row, or one the batch declares."""

    ident: Ident
    ref: TableRef | None = None
    new: tuple[TableRow, LanceTable] | None = None
    declared_by: int | None = None
    steps: list[tuple[int, str, Proposal]] = field(default_factory=list)


class Batch:
    """BatchCommitTables semantics:

    - Operations apply in request order; each sees the effects of those before it (a version created by an
      earlier operation exists for a later one; a table deregistered earlier is gone for later ones; a name
      deregistered earlier may be declared again).
    - All or nothing: every table's part is validated by its actor and all rows are written in one database
      transaction (`Registry.transact`). Any rejection rejects the whole batch with that operation's error
      (its message names the operation index); nothing is applied.
    - Operations on a table declared in the same batch are folded into its creation; deregistering a table the
      same batch declared is refused as pointless.
    - Staged manifests are read before anything is decided; their final copies are written once the commit is
      recorded (like every version/create) and staging files are removed after that.
    """

    def __init__(self, service: LanceService, ops: list[Op]):
        self.service = service
        self.ops = ops
        self.live: dict[Ident, Target | None] = {}
        self.targets: list[Target] = []
        self.deleted: dict[Ident, list[tuple[int, int]]] = {}   # version ranges earlier operations delete

    async def _target(self, index: int, op: Op) -> Target:
        if op.ident in self.live:
            target = self.live[op.ident]
            if target is None:
                raise rules.labelled(NoSuchTable("the table was deregistered by an earlier operation of this batch"),
                                     index, op.label)
            return target
        try:
            ref = await self.service.resolve(op.ident)
        except NotFound as exc:
            raise rules.labelled(exc, index, op.label)
        target = Target(op.ident, ref=ref)
        self.live[op.ident] = target
        self.targets.append(target)
        return target

    async def _declare(self, index: int, op: Op) -> None:
        service = self.service
        if op.ident in self.live:   # declared, or deregistered (None), by an earlier operation
            taken = self.live[op.ident] is not None
        else:
            taken = await service.current_id(op.ident) is not None
        if taken:
            raise rules.labelled(TableExists(f"Table already exists: {show(op.ident)}"), index, op.label)
        await service.describe_namespace(op.ident[:-1])
        await service.namespaces.learn(op.ident[:-1])
        target = Target(op.ident, new=service.new_table(op.ident, op.request.location, op.request.properties),
                        declared_by=index)
        if op.request.location:
            await service.check_no_namespace_inside(target.new[1].location)
            await service.check_unused(target.new[1].location)
        self.live[op.ident] = target
        self.targets.append(target)

    async def _plan(self) -> None:
        service = self.service
        for index, op in enumerate(self.ops):
            try:
                rules.check_table_ident(op.ident)
            except BadRequest as exc:
                raise BadRequest(f"operation {index} ({op.kind}): {exc.message}") from None
            if op.kind == "declare_table":
                await self._declare(index, op)
                continue
            target = await self._target(index, op)
            location = target.ref.location if target.ref else target.new[1].location
            if op.kind == "create_table_version":
                proposal = await service.prepare_version(location, op.request)
            elif op.kind == "delete_table_versions":
                rules.check_branch(op.request.branch)
                ranges = [(r.start_version, r.end_version) for r in op.request.ranges]
                earlier = self.deleted.setdefault(op.ident, [])
                # A table this batch declares has every version in memory.
                proposal = DeleteVersions(ranges) if target.ref is None else await service.version_deletion(
                    target.ref, ranges, earlier)
                earlier.extend(ranges)
            else:  # deregister_table
                rules.check_deregistrable(index, op.label, target.declared_by)
                proposal = RemoveTable()
                self.live[op.ident] = None
            target.steps.append((index, op.label, proposal))

    async def run(self) -> list[Any]:
        await self._plan()
        service = self.service
        parts, creates, replies, after = [], [], {}, []
        for t in self.targets:
            if t.new is None:
                parts.append((t.ref.table_id, Steps(t.steps)))
                continue
            row, initial = t.new
            d = Steps(t.steps).decide(initial)   # pure; raises (nothing applied) like an actor would
            replies.update(d.reply)
            replies[t.declared_by] = d.state
            creates.append(NewTable(row, d.state, d.state.row_state(), d.log, published=d.published,
                                    changes=[feed_change("created", initial), *d.changes]))
            if d.after_durable is not None:
                after.append(d.after_durable)
        try:
            part_replies = await service.transact(parts, creates)
        except NoSuchNamespace:
            raise
        except NotFound as exc:
            # A part's actor found its table gone (the plan refuses an operation on a table an earlier one
            # deregistered, so no operation's own refusal is a NotFound here): if a name now stands for another
            # table, or none, the batch is planned again.
            if await self._names_moved():
                raise _StaleName() from exc
            raise
        for r in part_replies:
            replies.update(r)
        for t in self.targets:
            if t.new is not None:
                service.remember(t.ident, t.new[0].table_id, t.new[0].location)
            elif any(isinstance(p, RemoveTable) for _, _, p in t.steps):
                service.forget(t.ident)
        for fn in after:
            await fn()   # a Steps chain: it logs and swallows a failed clean-up itself
        return [(op.kind, replies[i]) for i, op in enumerate(self.ops)]

    async def _names_moved(self) -> bool:
        for t in self.targets:
            if t.ref is not None and await self.service.current_id(t.ident) != t.ref.table_id:
                return True
        return False
