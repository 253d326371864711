"""Lance's commit rules without a server: each rule's accepted and refused cases, refusals by their typed error."""

from __future__ import annotations

import pytest

from coordinator.errors import BadRequest, NoSuchTable, Recount, TableExists, Unsupported, VersionExists
from coordinator.lance import rules
from coordinator.lance.files import FoundManifest
from coordinator.lance.layout import MANIFEST_MAGIC, manifest_name, manifest_uri
from coordinator.lance.proposals import CreateVersion, DeleteVersions, RemoveTable, Steps
from coordinator.lance.state import LanceTable, TableVersion, in_ranges

LOC = "s3://bucket/wh/ns/t"
WAREHOUSE = "s3://bucket/wh"


def version(n: int, staging: str | None = None, sha: str | None = None) -> TableVersion:
    return TableVersion(n, manifest_uri(LOC, n, "V2"), 10, 0, "V2", staging, sha)


def table(*numbers: int, high_water: int | None = None, log_below: int = 0, deletes: int = 0) -> LanceTable:
    versions = [version(n, f"{LOC}/_versions/{n}.staged", f"sha{n}") for n in numbers]
    high = max(numbers, default=0) if high_water is None else high_water
    return LanceTable(("ns",), "t", LOC, {}, versions, high, log_below=log_below, deletes=deletes)


# -- identifiers and branches ------------------------------------------------------------------------------------


def test_levels_accept_plain_names():
    rules.check_levels(("a", "b"), "namespace")
    rules.check_table_ident(("ns", "t"))


@pytest.mark.parametrize("levels", [("",), ("a/b",), ("a\x00",), ("a\x1fb",)])
def test_levels_refuse_empty_control_and_slash(levels):
    with pytest.raises(BadRequest):
        rules.check_levels(levels, "namespace")


def test_a_table_identifier_needs_a_name():
    with pytest.raises(BadRequest):
        rules.check_table_ident(())


@pytest.mark.parametrize("branch", [None, "", "main"])
def test_main_branch_is_served(branch):
    rules.check_branch(branch)


def test_other_branches_are_unsupported():
    with pytest.raises(Unsupported):
        rules.check_branch("dev")


# -- version numbering -------------------------------------------------------------------------------------------


def test_the_next_version_is_high_water_plus_one():
    rules.check_next_version(table(1, 2), 3)
    rules.check_next_version(table(), 1)


def test_version_zero_is_refused():
    with pytest.raises(BadRequest):
        rules.check_next_version(table(), 0)


def test_a_version_ahead_of_the_next_is_a_conflict_and_a_reload():
    with pytest.raises(VersionExists) as raised:
        rules.check_next_version(table(1), 3)
    assert raised.value.reload


def test_a_deleted_version_number_is_never_reused():
    with pytest.raises(VersionExists, match="never reused"):
        rules.check_next_version(table(1, 3, high_water=3), 2)


def test_a_version_only_in_the_commit_log_exists():
    with pytest.raises(VersionExists, match="already exists"):
        rules.check_next_version(table(5, 6, log_below=5), 2)


def test_the_same_commit_is_recognised_by_path_or_bytes():
    existing = version(2, f"{LOC}/_versions/a.staged", "abc")
    assert rules.same_commit(existing, f"{LOC}/_versions/a.staged", None)
    assert rules.same_commit(existing, f"{LOC}/_versions/b.staged", "abc")
    assert not rules.same_commit(existing, f"{LOC}/_versions/b.staged", "def")
    assert not rules.same_commit(existing, f"{LOC}/_versions/b.staged", None)


def test_create_version_answers_the_same_commit_again_and_refuses_another():
    state = table(1)
    same = CreateVersion(1, f"{LOC}/_versions/1.staged", b"x" + MANIFEST_MAGIC, None, "V2", 0)
    assert same.decide(state).reply == state.find(1)
    other = CreateVersion(1, f"{LOC}/_versions/other", b"x" + MANIFEST_MAGIC, "zzz", "V2", 0)
    with pytest.raises(VersionExists):
        other.decide(state)


def test_create_version_refuses_a_version_not_next_and_a_missing_staged_manifest():
    with pytest.raises(VersionExists):
        CreateVersion(3, f"{LOC}/_versions/3.staged", b"x" + MANIFEST_MAGIC, "s3", "V2", 0).decide(table(1))
    with pytest.raises(BadRequest):
        CreateVersion(2, f"{LOC}/_versions/2.staged", None, None, "V2", 0).decide(table(1))


def test_create_version_records_the_next_version():
    data = b"x" + MANIFEST_MAGIC
    d = CreateVersion(2, f"{LOC}/_versions/2.staged", data, "s", "V2", 7).decide(table(1))
    assert d.state.high_water == 2 and d.reply.version == 2 and d.reply.size == len(data)
    assert d.published[0][0] == manifest_uri(LOC, 2, "V2")


# -- staged manifests --------------------------------------------------------------------------------------------


def test_naming_schemes():
    rules.check_naming_scheme(None)
    rules.check_naming_scheme("V1")
    with pytest.raises(BadRequest):
        rules.check_naming_scheme("V3")


def test_a_staged_manifest_sits_in_versions():
    assert rules.check_staging_path(LOC, f"{LOC}/_versions/x.staged", 3) == "x.staged"
    # the final name of the version itself is the client's own file: accepted
    final = manifest_name(3, "V2")
    assert rules.check_staging_path(LOC, f"{LOC}/_versions/{final}", 3) == final


@pytest.mark.parametrize("uri", [f"{LOC}/data/x.lance", f"{LOC}/_versions/sub/x", "s3://bucket/other/_versions/x",
                                 f"{LOC}/_versions/{manifest_name(2, 'V2')}"])
def test_a_staged_manifest_elsewhere_or_another_versions_final_is_refused(uri):
    with pytest.raises(BadRequest):
        rules.check_staging_path(LOC, uri, 3)


def test_a_staged_manifest_matches_its_size_and_footer():
    data = b"abc" + MANIFEST_MAGIC
    rules.check_staged_manifest(data, None, "p")
    rules.check_staged_manifest(data, len(data), "p")
    with pytest.raises(BadRequest, match="manifest_size"):
        rules.check_staged_manifest(data, len(data) + 1, "p")
    with pytest.raises(BadRequest, match="not a Lance manifest"):
        rules.check_staged_manifest(b"abcdefg", None, "p")


def test_a_staged_manifest_must_exist():
    assert rules.check_staged_exists(b"m", "u", 1) == b"m"
    with pytest.raises(BadRequest):
        rules.check_staged_exists(None, "u", 1)


# -- deleting version records ------------------------------------------------------------------------------------


def test_deletion_ranges_are_half_open_and_minus_one_runs_through_the_latest():
    assert in_ranges(1, [(1, 3)]) and in_ranges(2, [(1, 3)])
    assert not in_ranges(3, [(1, 3)])
    assert in_ranges(10**6, [(5, -1)])
    assert not in_ranges(4, [(5, -1)])


def test_a_count_made_in_another_state_is_stale():
    state = table(5, 6, log_below=5, deletes=2)
    rules.check_counted(state, 5, 2)
    with pytest.raises(Recount):
        rules.check_counted(state, 4, 2)
    with pytest.raises(Recount):
        rules.check_counted(state, 5, 1)


def test_delete_versions_counts_memory_and_log():
    state = table(5, 6, 7, log_below=5, deletes=1)
    d = DeleteVersions([(1, 7)], 5, 3, 1).decide(state)
    assert d.reply == 5 and [v.version for v in d.state.versions] == [7]
    with pytest.raises(Recount):
        DeleteVersions([(1, 7)], 4, 3, 1).decide(state)


# -- declared, registered and deregistered tables ----------------------------------------------------------------


def test_a_location_below_the_warehouse_is_accepted():
    assert rules.check_location(WAREHOUSE, f"{WAREHOUSE}/ns/t/", f"{WAREHOUSE}/ns", ("ns",), True) == \
        f"{WAREHOUSE}/ns/t"


@pytest.mark.parametrize("location", [WAREHOUSE, "s3://bucket/elsewhere/t", f"{WAREHOUSE}/ns/t?x"])
def test_a_location_outside_the_warehouse_or_unsafe_is_refused(location):
    with pytest.raises(BadRequest):
        rules.check_location(WAREHOUSE, location, f"{WAREHOUSE}/ns", ("ns",), False)


def test_with_authentication_a_location_stays_in_its_namespace():
    rules.check_location(WAREHOUSE, f"{WAREHOUSE}/other/t", f"{WAREHOUSE}/ns", ("ns",), False)
    with pytest.raises(BadRequest, match="authentication"):
        rules.check_location(WAREHOUSE, f"{WAREHOUSE}/other/t", f"{WAREHOUSE}/ns", ("ns",), True)


def test_a_taken_name_is_refused():
    rules.check_name_free(("ns", "t"), False)
    with pytest.raises(TableExists):
        rules.check_name_free(("ns", "t"), True)


FOUND = [FoundManifest(1, "V2", manifest_uri(LOC, 1, "V2"), 10, 0)]


def test_a_declared_location_holds_no_manifests_nor_other_files():
    rules.check_declarable(LOC, [], None)
    with pytest.raises(BadRequest, match="register"):
        rules.check_declarable(LOC, FOUND, None)
    with pytest.raises(BadRequest, match="not a new Lance table's"):
        rules.check_declarable(LOC, [], "wh/ns/t/data/00000-0-a.parquet")


def test_a_declared_location_may_hold_only_what_a_writer_stages_ahead_of_the_first_version():
    from coordinator.lance.layout import is_lances, staged_ahead
    for own in ("data/a.lance", "data/x/y.lance", "_versions/1.manifest-abc", "_versions/latest_version_hint.json",
                "_transactions/0-a.txn", "_deletions/0-1-2.arrow", "_indices/u/page_data.lance", "_refs/tags/t.json",
                "tree/b1/_versions/1.manifest-x", "tree/b1/data/f.lance"):
        assert is_lances(own) and staged_ahead(own), own
    for final in ("_versions/1.manifest", "_versions/18446744073709551614.manifest", "tree/b/_versions/2.manifest",
                  "_latest.manifest"):
        assert is_lances(final) and not staged_ahead(final), final
    for other in ("data/00000-0-a.parquet", "metadata/v1.metadata.json", "_delta_log/0.json", "_versions",
                  "notes.txt", "tree/b1/x.parquet", "tree/_versions", "a.lance"):
        assert not is_lances(other) and not staged_ahead(other), other


def test_a_registered_location_holds_a_lance_manifest():
    rules.check_registrable(LOC, FOUND, b"bytes" + MANIFEST_MAGIC)
    with pytest.raises(BadRequest, match="holds no manifest"):
        rules.check_registrable(LOC, [], None)
    with pytest.raises(BadRequest, match="not a Lance manifest"):
        rules.check_registrable(LOC, FOUND, b"bytes")


def test_remove_table_deletes_the_row_and_answers_the_table():
    state = table(1)
    d = RemoveTable().decide(state)
    assert d.delete and d.reply is state and d.state is None


# -- batches -----------------------------------------------------------------------------------------------------


def test_an_operation_after_the_tables_deregistration_is_refused():
    rules.check_not_removed(3, "create_table_version ns.t", None)
    with pytest.raises(NoSuchTable, match=r"^operation 3 \(create_table_version ns.t\): .*operation 1"):
        rules.check_not_removed(3, "create_table_version ns.t", 1)


def test_deregistering_a_table_the_batch_declares_is_refused():
    rules.check_deregistrable(2, "deregister_table ns.t", None)
    with pytest.raises(BadRequest, match=r"^operation 2 .*declared by operation 0"):
        rules.check_deregistrable(2, "deregister_table ns.t", 0)


def test_steps_apply_in_order_and_name_the_refused_operation():
    data = b"x" + MANIFEST_MAGIC
    create = CreateVersion(2, f"{LOC}/_versions/2.staged", data, "s2", "V2", 0)
    d = Steps([(0, "create", create), (1, "delete", DeleteVersions([(1, 2)]))]).decide(table(1))
    assert d.reply == {0: d.reply[0], 1: 1} and [v.version for v in d.state.versions] == [2]
    again = CreateVersion(2, f"{LOC}/_versions/other", data, "other", "V2", 0)
    with pytest.raises(VersionExists, match=r"^operation 1 \(again\): "):
        Steps([(0, "create", create), (1, "again", again)]).decide(table(1))
    with pytest.raises(NoSuchTable, match=r"^operation 1 "):
        Steps([(0, "deregister", RemoveTable()), (1, "create", create)]).decide(table(1))
