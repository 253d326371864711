"""Appends rebased by the table's actor (coordinator/iceberg/rebase.py), decided in process against real files:
what is rebased and what keeps its 409, what the rebased snapshot and its manifest list hold, and every bad
input's answer. The files are pyiceberg's writers' (tests/iceberg_appends.py); the proposal is decided as the
actor decides it and offered again with what the service reads, as IcebergService does."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestEntryStatus

from coordinator.errors import BadRequest, CommitConflict
from coordinator.iceberg import new_table_metadata, parse_requirements, parse_updates
from coordinator.iceberg.proposals import CommitTable
from coordinator.iceberg.rebase import MAX_LIST_BYTES, REBASE_PROPERTY, RebaseNeeded, read_for_rebase, recount
from coordinator.iceberg.state import IcebergTable, TableIdent
from storage.files import FileIO, join
from tests import iceberg_appends as client

IDENT = TableIdent("", ("db",), "t")
SCHEMA = {"type": "struct", "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}


def new_table(tmp_path: Path, format_version: int = 2, rebase: bool = True) -> IcebergTable:
    location = (tmp_path / "t").as_uri()
    metadata = new_table_metadata(location=location, schema=SCHEMA, partition_spec=None, sort_order=None,
                                  properties={REBASE_PROPERTY: "true"} if rebase else {},
                                  format_version=format_version, table_uuid="9c12d441-03fe-4693-9a96-a0705ddf69c1",
                                  now_ms=1_700_000_000_000)
    os.makedirs(tmp_path / "t" / "metadata", exist_ok=True)
    return IcebergTable(IDENT, metadata, join(location, "metadata", "00000-x.metadata.json"), b"{}")


class Table:
    """A table's state as its actor holds it, committed to as the service commits (rebase reads included)."""

    def __init__(self, state: IcebergTable):
        self.state = state
        self.files = FileIO()
        self.needed: list[RebaseNeeded] = []   # what each commit asked the service to read

    @property
    def metadata(self) -> dict:
        return self.state.metadata

    async def commit(self, body: dict) -> dict:
        read = None
        while True:
            proposal = CommitTable(IDENT, parse_requirements(body["requirements"]), parse_updates(body["updates"]),
                                   read=read)
            try:
                decision = proposal.decide(self.state)
            except RebaseNeeded as needed:
                self.needed.append(needed)
                read = await read_for_rebase(self.files, needed, read)
                continue
            await self.files.write_many(decision.files)
            self.state = decision.state
            return decision.state.metadata


async def moved_on(tmp_path: Path) -> tuple[Table, dict]:
    """A table with rebasing on and `base`, its metadata after one append; another append has landed since."""
    t = Table(new_table(tmp_path))
    base = await t.commit(client.append(t.metadata))
    await t.commit(client.append(base))
    return t, base


def main_history(metadata: dict) -> list[dict]:
    by_id = {s["snapshot-id"]: s for s in metadata["snapshots"]}
    out, at = [], client.head(metadata)
    while at is not None:
        out.append(by_id[at])
        at = by_id[at].get("parent-snapshot-id")
    return out[::-1]


async def test_a_stale_append_lands_on_the_head_keeping_its_id(tmp_path):
    t = Table(new_table(tmp_path))
    first = await t.commit(client.append(t.metadata, 2))
    base = first   # both writers start from here
    mine = client.data_file(base["location"], 5)
    a, b = client.append(base, 3), client.append(base, files=[mine])
    await t.commit(a)
    rebased = await t.commit(b)
    a_id, b_id = (body["updates"][0]["snapshot"]["snapshot-id"] for body in (a, b))
    history = main_history(rebased)
    assert [s["snapshot-id"] for s in history][1:] == [a_id, b_id]
    assert [s["sequence-number"] for s in history] == [1, 2, 3]
    snap = history[-1]
    assert snap["parent-snapshot-id"] == a_id and rebased["last-sequence-number"] == 3
    assert snap["manifest-list"] != b["updates"][0]["snapshot"]["manifest-list"]
    assert "-rebased-" in snap["manifest-list"]
    assert snap["manifest-list"].startswith(t.metadata["location"] + "/metadata/")
    assert snap["timestamp-ms"] >= history[-2]["timestamp-ms"]
    assert snap["summary"]["total-records"] == "10" and snap["summary"]["total-data-files"] == "3"
    assert snap["summary"]["added-records"] == "5"
    # the new list: this snapshot's manifest first, with the commit's sequence number, then the head's
    listed = client.manifests_of(rebased, b_id)
    head_listed = client.manifests_of(rebased, a_id)
    assert [m.path for m in listed[1:]] == [m.path for m in head_listed]
    assert listed[0].added_snapshot_id == b_id and listed[0].sequence_number == listed[0].min_sequence_number == 3
    assert client.data_files(rebased, b_id) == client.data_files(rebased, a_id) | {mine.file_path}
    assert rebased["snapshot-log"][-1]["snapshot-id"] == b_id and rebased["current-snapshot-id"] == b_id


async def test_first_appends_to_an_empty_table(tmp_path):
    t = Table(new_table(tmp_path))
    empty = t.metadata
    a, b, c = (client.append(empty, n) for n in (1, 2, 3))
    for body in (a, b, c):
        await t.commit(body)
    history = main_history(t.metadata)
    assert [s["snapshot-id"] for s in history] == [body["updates"][0]["snapshot"]["snapshot-id"] for body in (a, b, c)]
    assert [s["sequence-number"] for s in history] == [1, 2, 3]
    assert history[-1]["summary"]["total-records"] == "6"
    assert len(client.data_files(t.metadata, client.head(t.metadata))) == 3


async def test_appends_in_a_row_rebase_onto_lists_the_actor_keeps(tmp_path):
    """The lists the actor wrote are kept with its state: the stale appends read their own files, and the lists
    clients wrote (their parent's, the head's) once, never a list the actor wrote."""
    t = Table(new_table(tmp_path))
    base = await t.commit(client.append(t.metadata))
    bodies = [client.append(base) for _ in range(5)]
    await t.commit(bodies[0])
    t.needed.clear()
    for body in bodies[1:]:
        await t.commit(body)
    client_lists = {base["snapshots"][0]["manifest-list"], bodies[0]["updates"][0]["snapshot"]["manifest-list"]}
    asked = [path for needed in t.needed for path in needed.lists]
    assert set(asked) == client_lists and len(asked) == len(set(asked)), asked   # never a list this actor wrote
    assert [s["sequence-number"] for s in main_history(t.metadata)] == list(range(1, 7))
    assert len(client.data_files(t.metadata, client.head(t.metadata))) == 6


async def test_format_v3_assigns_row_ids_from_next_row_id(tmp_path):
    t = Table(new_table(tmp_path, format_version=3))
    base = await t.commit(client.append(t.metadata, 4))
    assert base["next-row-id"] == 4
    a, b = client.append(base, 3), client.append(base, 5)
    await t.commit(a)
    md = await t.commit(b)
    snap = main_history(md)[-1]
    assert snap["first-row-id"] == 7 and snap["added-rows"] == 5 and md["next-row-id"] == 12
    own = client.manifests_of(md, snap["snapshot-id"])[0]
    assert own.first_row_id == 7 and own.sequence_number == 3
    assert [m.first_row_id for m in client.manifests_of(md, snap["snapshot-id"])[1:]] == [4, 0]


async def test_format_v1(tmp_path):
    t = Table(new_table(tmp_path, format_version=1))
    base = t.metadata
    for n in (1, 2):
        await t.commit(client.append(base, n))
    history = main_history(t.metadata)
    assert len(history) == 2 and history[1]["parent-snapshot-id"] == history[0]["snapshot-id"]
    assert len(client.data_files(t.metadata, client.head(t.metadata))) == 2


async def test_entries_with_their_own_sequence_number_keep_it(tmp_path):
    """DuckDB writes each added entry's data sequence number itself (its idea of the commit's): kept, and the
    manifest's least sequence number says so, while the delete files committed since are none."""
    t = Table(new_table(tmp_path))
    base = await t.commit(client.append(t.metadata))
    sid = client.new_snapshot_id()
    own = client.manifest(base, sid, [client.data_file(base["location"], 1)], sequence_number=2)
    await t.commit(client.append(base))
    md = await t.commit(client.append(base, snapshot_id=sid, own=[own]))
    listed = client.manifests_of(md, sid)[0]
    assert (listed.sequence_number, listed.min_sequence_number) == (3, 2)


async def test_entries_with_their_own_sequence_number_are_not_rebased_past_deletes(tmp_path):
    t = Table(new_table(tmp_path))
    base = await t.commit(client.append(t.metadata))
    sid, other = client.new_snapshot_id(), client.new_snapshot_id()
    own = client.manifest(base, sid, [client.data_file(base["location"], 1)], sequence_number=2)
    deletes = client.manifest(base, other, [client.data_file(base["location"], 1, DataFileContent.EQUALITY_DELETES)],
                              content=ManifestContent.DELETES)
    # an append, then an overwrite that added delete files (sequence number 3, above the entry's 2)
    later = await t.commit(client.append(base))
    await t.commit(client.append(later, snapshot_id=other, own=[deletes], operation="overwrite"))
    with pytest.raises(CommitConflict, match="delete files were committed since") as refused:
        await t.commit(client.append(base, snapshot_id=sid, own=[own]))
    assert refused.type is CommitConflict


# -- what keeps its 409 ------------------------------------------------------------------------------------------


async def _conflict_without_rebase(tmp_path, body_of) -> tuple[str, str]:
    """The message a commit gets with rebasing on, and the one it gets on a table without it."""
    messages = []
    for rebase in (True, False):
        t = Table(new_table(tmp_path / str(rebase), rebase=rebase))
        base = await t.commit(client.append(t.metadata))
        await t.commit(client.append(base))
        with pytest.raises(CommitConflict) as refused:
            await t.commit(body_of(base))
        assert not t.needed, "nothing should have been read"
        messages.append(refused.value.message)
    return messages[0], messages[1]


@pytest.mark.parametrize("case", ["overwrite", "more-updates", "tag", "other-requirement", "parent-not-asserted",
                                  "no-ref-update"])
async def test_commits_that_are_not_appends_keep_their_409(tmp_path, case):
    def body_of(base: dict) -> dict:
        if case == "overwrite":
            return client.append(base, operation="overwrite")
        if case == "more-updates":
            return client.append(base, extra_updates=[{"action": "set-properties", "updates": {"k": "v"}}])
        if case == "tag":
            body = client.append(base)
            body["updates"][1]["type"] = "tag"
            return body
        if case == "other-requirement":
            body = client.append(base)
            body["requirements"].append({"type": "assert-current-schema-id", "current-schema-id": 7})
            return body
        if case == "parent-not-asserted":
            body = client.append(base)
            body["updates"][0]["snapshot"]["parent-snapshot-id"] = client.new_snapshot_id()
            return body
        body = client.append(base)
        del body["updates"][1]
        body["updates"].append({"action": "set-properties", "updates": {"k": "v"}})
        return body
    with_rebasing, without = await _conflict_without_rebase(tmp_path, body_of)
    assert re.sub(r"\d+", "N", with_rebasing) == re.sub(r"\d+", "N", without)   # (the tables' ids differ)


async def test_a_list_without_its_parents_manifests_is_not_rebased(tmp_path):
    t = Table(new_table(tmp_path))
    base = await t.commit(client.append(t.metadata))
    base = await t.commit(client.append(base))
    await t.commit(client.append(base))
    with pytest.raises(CommitConflict, match="not rebased: its manifest list does not hold exactly its parent's "
                                             r"manifests besides its own \(1 of the parent's missing"):
        await t.commit(client.append(base, inherited=client.manifests_of(base, client.head(base))[:1]))


@pytest.mark.parametrize("status", [ManifestEntryStatus.EXISTING, ManifestEntryStatus.DELETED])
async def test_an_append_whose_manifest_holds_other_entries_is_not_rebased(tmp_path, status):
    t, base = await moved_on(tmp_path)
    sid = client.new_snapshot_id()
    own = client.manifest(base, sid, [client.data_file(base["location"], 1)], status=status,
                          sequence_number=1)
    with pytest.raises(CommitConflict, match="not rebased: its manifest .* (holds an entry with status|is not one "
                                             "of added data files only)"):
        await t.commit(client.append(base, snapshot_id=sid, own=[own]))


@pytest.mark.parametrize("content", [DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES])
async def test_an_append_holding_deletes_is_not_rebased(tmp_path, content):
    t, base = await moved_on(tmp_path)
    sid = client.new_snapshot_id()
    files = [client.data_file(base["location"], 1, content)]
    for own, match in (([client.manifest(base, sid, files)], "holds a (position|equality) deletes file"),
                       ([client.manifest(base, sid, files, content=ManifestContent.DELETES)],
                        "is not one of added data files only")):
        with pytest.raises(CommitConflict, match=f"not rebased: its manifest .* {match}"):
            await t.commit(client.append(base, snapshot_id=sid, own=own))
    assert client.head(t.metadata) != sid


async def test_a_taken_snapshot_id_is_not_rebased(tmp_path):
    t = Table(new_table(tmp_path))
    base = await t.commit(client.append(t.metadata))
    body = client.append(base)
    await t.commit(body)
    again = client.append(base, snapshot_id=body["updates"][0]["snapshot"]["snapshot-id"])
    with pytest.raises(CommitConflict, match="snapshot id .* is taken"):
        await t.commit(again)


# -- bad input: 400, saying what is wrong ------------------------------------------------------------------------


def _stale_with_list(t: Table, base: dict, make_list) -> dict:
    body = client.append(base)
    path = body["updates"][0]["snapshot"]["manifest-list"]
    make_list(path.removeprefix("file://"))
    return body


@pytest.mark.parametrize("bad, message", [
    ("missing", "does not exist: write it before committing"),
    ("link", "cannot be read: not a file reached without following a link"),
    ("fifo", "cannot be read: not a regular file"),
    ("oversized", f"has more than {MAX_LIST_BYTES} bytes"),
    ("not-avro", "is not an Avro manifest list"),
    ("truncated", "is not an Avro manifest list"),
    ("outside", "not within the table's location"),
])
async def test_a_manifest_list_that_cannot_be_read(tmp_path, bad, message):
    t, base = await moved_on(tmp_path)
    before = t.state
    body = client.append(base)
    path = Path(body["updates"][0]["snapshot"]["manifest-list"].removeprefix("file://"))
    good = path.read_bytes()
    path.unlink()
    if bad == "link":
        (tmp_path / "elsewhere.avro").write_bytes(good)
        path.symlink_to(tmp_path / "elsewhere.avro")
    elif bad == "fifo":
        os.mkfifo(path)
    elif bad == "oversized":
        with open(path, "wb") as f:
            f.truncate(MAX_LIST_BYTES + 1)
    elif bad == "not-avro":
        path.write_bytes(b'{"this": "is json"}')
    elif bad == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif bad == "outside":
        (tmp_path / "outside.avro").write_bytes(good)
        body["updates"][0]["snapshot"]["manifest-list"] = (tmp_path / "outside.avro").as_uri()
    error = CommitConflict if bad == "outside" else BadRequest   # (outside: never read, so never rebased)
    with pytest.raises(error, match=message) as refused:
        await t.commit(body)
    assert type(refused.value) is error
    assert t.state is before


async def test_a_manifest_of_its_own_that_cannot_be_read(tmp_path):
    t, base = await moved_on(tmp_path)
    body = client.append(base)
    own = client.manifests_of({**base, "snapshots": [{**body["updates"][0]["snapshot"]}]},
                              body["updates"][0]["snapshot"]["snapshot-id"])[0]
    Path(own.path.removeprefix("file://")).write_bytes(b"garbage")
    with pytest.raises(BadRequest, match="is not an Avro manifest"):
        await t.commit(body)
    Path(own.path.removeprefix("file://")).unlink()
    with pytest.raises(BadRequest, match="manifest .* does not exist"):
        await t.commit(body)


def test_totals_are_counted_from_the_new_parent():
    summary = {"operation": "append", "added-records": "5", "added-data-files": "1", "added-files-size": "10",
               "total-records": "7", "total-data-files": "2", "total-files-size": "20", "total-delete-files": "0"}
    assert recount(summary, {"total-records": "100", "total-data-files": "9", "total-files-size": "x"}) == {
        "operation": "append", "added-records": "5", "added-data-files": "1", "added-files-size": "10",
        "total-records": "105", "total-data-files": "10"}
    assert recount(summary, None) == {**summary, "total-records": "5", "total-data-files": "1",
                                      "total-files-size": "10", "total-delete-files": "0",
                                      "total-position-deletes": "0", "total-equality-deletes": "0"}


async def test_a_list_longer_than_a_rebase_holds_is_not_rebased(tmp_path, monkeypatch):
    from coordinator.iceberg import rebase
    monkeypatch.setattr(rebase, "MAX_LIST_MANIFESTS", 2)
    t = Table(new_table(tmp_path))
    base = t.metadata
    for _ in range(2):
        base = await t.commit(client.append(base))
    await t.commit(client.append(base))
    with pytest.raises(CommitConflict, match="lists more than 2 manifests: rewrite the table's manifests"):
        await t.commit(client.append(base))


async def test_an_append_in_a_partition_spec_the_table_no_longer_has_is_not_rebased(tmp_path):
    t, base = await moved_on(tmp_path)
    sid = client.new_snapshot_id()
    own = client.manifest(base, sid, [client.data_file(base["location"], 1)])
    own[2] = 7   # (partition_spec_id)
    with pytest.raises(CommitConflict, match="partition spec 7, which the table no longer has"):
        await t.commit(client.append(base, snapshot_id=sid, own=[own]))
