"""A table keeps only its latest versions in memory (`VERSIONS_KEPT`); older ones are read from the commit log.
Over real HTTP, with the window made tiny, every version route must answer exactly as if all were in memory:
listings in both directions and pages, describe of any version, deletes counting records on both sides of the
window, a resubmitted old version refused, and the same after a restart, which loads only the latest ones."""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest

from api.server import EmbeddedService
from coordinator.lance import state as lance_state
from tests.lance.conftest import stage
from tests.support import sql

NS, TABLE = "/v1/namespace", "/v1/table"
KEPT = 3


@pytest.fixture
def tiny_window(monkeypatch):
    monkeypatch.setattr(lance_state, "VERSIONS_KEPT", KEPT)


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def listed(http, **params) -> tuple[list[int], str | None]:
    body = ok(http.post(f"{TABLE}/db$t/version/list", params=params))
    return [v["version"] for v in body["versions"]], body.get("page_token")


def walk(http, limit: int, descending: bool) -> list[int]:
    """Every page, following the tokens."""
    out, token = [], None
    while True:
        params = {"limit": limit, "descending": str(descending).lower()}
        if token:
            params["page_token"] = token
        page, token = listed(http, **params)
        out += page
        if token is None:
            return out


def check_versions(http, recorded: list[int]) -> None:
    assert listed(http)[0] == recorded
    assert listed(http, descending="true")[0] == recorded[::-1]
    for limit in (1, 2, 5, 100):
        assert walk(http, limit, False) == recorded
        assert walk(http, limit, True) == recorded[::-1]
    for after in (0, 1, 4, 9, 12):
        assert listed(http, page_token=str(after))[0] == [v for v in recorded if v > after]
        assert listed(http, page_token=str(after), descending="true")[0] == [v for v in recorded if v < after][::-1]
    for v in range(1, max(recorded, default=13) + 2):
        r = http.post(f"{TABLE}/db$t/version/describe", json={"version": v})
        if v in recorded:
            assert ok(r)["version"]["version"] == v
        else:
            assert r.status_code == 404 and r.json()["code"] == 11, r.text


def table_with(http, count: int) -> str:
    """Namespace db and table db$t with versions 1..count; the table's location."""
    ok(http.post(f"{NS}/db/create", json={}))
    location = ok(http.post(f"{TABLE}/db$t/declare", json={}))["location"]
    for v in range(1, count + 1):
        ok(http.post(f"{TABLE}/db$t/version/create", json={"version": v, "manifest_path": stage(location, v)}))
    return location


def test_versions_older_than_memory_are_answered_from_the_log(config, tiny_window):
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        location = table_with(http, 12)
        recorded = list(range(1, 13))
        check_versions(http, recorded)

        # An old version sent again is refused as taken, not accepted: its number was recorded.
        r = http.post(f"{TABLE}/db$t/version/create", json={"version": 2, "manifest_path": stage(location, 2)})
        assert r.status_code == 409, r.text

        delete = f"{TABLE}/db$t/version/delete"
        assert ok(http.post(delete, json={"ranges": [{"start_version": 2, "end_version": 5}]})) == {
            "deleted_count": 3}
        # Both sides of the window at once: 1 below it, 11 in it.
        assert ok(http.post(delete, json={"ranges": [{"start_version": 1, "end_version": 4},
                                                     {"start_version": 11, "end_version": 12}]})) == {
            "deleted_count": 2}
        recorded = [5, 6, 7, 8, 9, 10, 12]
        check_versions(http, recorded)

    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:   # loads the latest only
        check_versions(http, recorded)
        ok(http.post(f"{TABLE}/db$t/version/create", json={"version": 13, "manifest_path": stage(location, 13)}))
        check_versions(http, recorded + [13])
        assert ok(http.post(f"{TABLE}/db$t/version/delete", json={"ranges": [{"start_version": 0,
                                                                               "end_version": -1}]})) == {
            "deleted_count": 8}
        check_versions(http, [])


def test_a_version_recorded_after_the_readers_state_is_not_shown_from_the_log(config, tiny_window):
    """Version N is recorded in the commit log before its final manifest is written, and answered only after: a
    reader that looks older versions up in the log (a forwarded read's state holds only the latest few) must not
    show a version its state could not, such as one recorded but not published yet. Version 13 recorded behind
    the actor's back stands for one."""
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        table_with(http, 12)
        sql(config.database_url, "INSERT INTO commits (table_id, version, payload) SELECT table_id, 13, payload "
                                  "FROM commits WHERE version = 12")
        recorded = list(range(1, 13))
        check_versions(http, recorded)


# -- the same answers with the window and with every version in memory (a review's findings) -------------------


@pytest.fixture(params=[KEPT, 1000], ids=["window", "all-in-memory"])
def kept(request, monkeypatch):
    monkeypatch.setattr(lance_state, "VERSIONS_KEPT", request.param)
    return request.param


@pytest.fixture
def twelve(config, kept):
    """A table with versions 1..12 (with the window: 9..12 in memory); yields an HTTP client."""
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        table_with(http, 12)
        yield http


def delete_op(start: int, end: int) -> dict:
    return {"delete_table_versions": {"id": ["db", "t"], "ranges": [{"start_version": start, "end_version": end}]}}


def test_describe_and_exists_of_an_old_version(twelve):
    assert ok(twelve.post(f"{TABLE}/db$t/describe", json={"version": 1}))["version"] == 1
    assert twelve.post(f"{TABLE}/db$t/exists", json={"version": 1}).status_code == 200
    assert twelve.post(f"{TABLE}/db$t/exists", json={"version": 13}).status_code == 404


def test_the_latest_version_after_deleting_those_in_memory(twelve):
    r = twelve.post(f"{TABLE}/db$t/version/delete", json={"ranges": [{"start_version": 9, "end_version": -1}]})
    assert ok(r) == {"deleted_count": 4}
    assert ok(twelve.post(f"{TABLE}/db$t/version/describe", json={}))["version"]["version"] == 8
    assert listed(twelve, limit=1, descending="true")[0] == [8]


def test_a_batch_deleting_the_first_version_in_memory_and_an_older_one(twelve):
    r = ok(twelve.post(f"{TABLE}/batch-commit", json={"operations": [delete_op(9, 10), delete_op(1, 2)]}))
    assert [x["delete_table_versions"]["deleted_count"] for x in r["results"]] == [1, 1]


def test_a_batch_deleting_one_old_range_twice_counts_it_once(twelve):
    r = ok(twelve.post(f"{TABLE}/batch-commit", json={"operations": [delete_op(1, 3), delete_op(1, 3)]}))
    assert [x["delete_table_versions"]["deleted_count"] for x in r["results"]] == [2, 0]


@pytest.mark.parametrize("token,descending", [(str(2**70), "true"), (str(-2**70), "false"), ("-1", "true")])
def test_a_page_token_outside_the_version_range_is_refused(twelve, token, descending):
    r = twelve.post(f"{TABLE}/db$t/version/list", params={"page_token": token, "descending": descending})
    assert r.status_code == 400 and r.json()["code"] == 13, r.text


def test_an_idle_table_answers_for_versions_it_no_longer_holds(config):
    """With the real window: an idle table keeps its latest 4 versions in memory."""
    config = dataclasses.replace(config, actor_idle_s=0.2)
    with EmbeddedService(config) as base, httpx.Client(base_url=base, timeout=30) as http:
        table_with(http, 6)
        time.sleep(1)
        assert ok(http.post(f"{TABLE}/db$t/describe", json={"version": 1}))["version"] == 1
        check_versions(http, list(range(1, 7)))
