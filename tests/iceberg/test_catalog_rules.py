"""The catalog's own rules (coordinator/iceberg/rules/catalog.py): names, format versions, moves, name clashes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from coordinator.errors import BadRequest, TableExists, ViewExists
from coordinator.iceberg.rules.catalog import check_moved, check_name, check_namespace, format_version, name_taken


def test_names_and_namespaces_that_could_never_be_addressed_are_refused():
    for bad in ("", ".", "..", "a/b", "a\x00"):
        with pytest.raises(BadRequest):
            check_name(bad)
    for bad in ((), ("",), ("a/b",), ("a\x1fb",)):
        with pytest.raises(BadRequest):
            check_namespace(bad)
    check_name("t")
    check_namespace(("a", "b"))


def test_format_version_is_an_integer_if_given():
    assert format_version({}) is None and format_version({"format-version": "3"}) == 3
    with pytest.raises(BadRequest, match="format-version must be an integer"):
        format_version({"format-version": "three"})


def test_set_location_moves_only_below_the_warehouse():
    check_moved("file:///wh", {"location": "file:///wh/t"}, {"location": "file:///wh/u"})
    check_moved(None, {"location": "file:///wh/t"}, {"location": "file:///elsewhere"})   # no warehouse: no check
    with pytest.raises(BadRequest, match="not below the warehouse"):
        check_moved("file:///wh", {"location": "file:///wh/t"}, {"location": "file:///elsewhere/t"})


def test_a_name_clash_says_which_kind_holds_the_name():
    view = SimpleNamespace(kind="view")
    table = SimpleNamespace(kind="table")
    clash = name_taken(table, "db.v", "view")
    assert isinstance(clash, TableExists) and str(clash) == "Table with same name already exists: db.v"
    clash = name_taken(view, "db.t", "table")
    assert isinstance(clash, ViewExists) and str(clash) == "View with same name already exists: db.t"
    assert isinstance(name_taken(None, "db.t", "table"), TableExists)
    assert str(name_taken(view, "db.v", "view")) == "View already exists: db.v"
