"""The commit feed's events: what the commit path writes with each commit, and how a reader sees them.

A format's proposals say what changed (`decision.Change`: the CloudEvents type and the format's data); this module
adds what every event carries whatever its format (the table's id and name, the commit's id, the securable a
reader must be allowed to read to see it) and makes the `EventRecord`s the writer inserts in the commit's own
transaction. Readers get CloudEvents 1.0 in JSON, each with the `sequence` extension attribute: its position in
the feed, a token to resume right after it.
"""

from __future__ import annotations

import re
from typing import Any, Callable
from uuid import UUID

from storage.records import EventRecord, Position, StoredEvent, split_namespace

from .auth import Resource, table_securable
from .decision import Change
from .errors import BadRequest
from .keys import new_key, uuid7

SOURCE = "urn:commit-coordinator"
_TOKEN = re.compile(r"[0-9a-f]{32}")


def name_parts(catalog: str, namespace: str, name: str) -> list[str]:
    """A table's full name, outermost first: its catalog if it has one, namespace levels, name."""
    return [*([catalog] if catalog else []), *split_namespace(namespace), name]


# A table's securable from its (catalog, namespace, name): its format's (coordinator/format.py Format.securable).
Securable = Callable[[str, str, str], Resource]


def named_securable(kind: str) -> Securable:
    """The securable of a table of a row kind no format declared (tests' own kinds): the kind, the catalog if it
    is named, the namespace levels, the name."""
    return lambda catalog, namespace, name: table_securable(
        (kind, *([catalog] if catalog else []), *split_namespace(namespace)), name)


def securable_key(path: Resource) -> str:
    """A securable as the feed stores and matches it (storage/records.py `FeedScope`, migration 015): its names
    joined by "/", each with "%" and "/" escaped, so that a container's key and "/" begin the keys of exactly
    what is within it."""
    return "/".join(str(part).replace("%", "%25").replace("/", "%2F") for part in path)


def records(table_id: UUID, name: tuple[str, str, str], changes: list[Change], securable: Securable,
            commit_id: str | None = None) -> list[EventRecord]:
    """`changes` of the table `table_id`, named (catalog, namespace, name), as the events of one commit; a reader
    sees them if it may read the table's `securable`."""
    commit_id = commit_id or new_key()
    parts = name_parts(*name)
    subject = ".".join(parts)
    return [EventRecord(uuid7(), c.type, subject, name[0],
                        {**c.data, "table-id": str(table_id), "name": parts, "commit-id": commit_id},
                        securable_key(securable(*name)))
            for c in changes]


def share_commit_id(events: list[EventRecord], commit_id: str) -> None:
    """The events of one atomic commit (a transaction across tables) carry one commit id."""
    for e in events:
        e.data["commit-id"] = commit_id


def token(position: Position) -> str:
    """A position in the feed as the opaque token readers pass back (`after`): fixed width, so tokens sort as
    the positions they stand for."""
    return f"{position[0]:016x}{position[1]:016x}"


def position(token_: str) -> Position:
    xid, seq = (int(token_[:16], 16), int(token_[16:], 16)) if _TOKEN.fullmatch(token_) else (-1, -1)
    if not (0 <= xid < 2**63 and 0 <= seq < 2**31):   # (a transaction's events are numbered in an int)
        raise BadRequest(f"malformed feed token {token_[:80]!r}: pass back a `next` or an event's `sequence` as it "
                         f"was given")
    return xid, seq


def cloud_event(e: StoredEvent) -> dict[str, Any]:
    return {"specversion": "1.0", "id": str(e.id), "source": SOURCE, "type": e.type, "subject": e.subject,
            "time": e.time.isoformat(), "datacontenttype": "application/json", "sequence": token(e.position),
            "data": e.data}
