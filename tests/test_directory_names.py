"""Names become directories one to one (`storage.files.path_segment`, `IcebergService.namespace_dir`). With
authentication on, a table may be placed only inside its namespace's directory: two namespaces sharing one
directory would let a client with grants on one claim the other's place."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from coordinator.config import Config
from coordinator.iceberg.service import IcebergService
from coordinator.iceberg.state import TableIdent
from coordinator.warehouses import Warehouses
from storage.files import FileIO, path_segment, unsafe_location

NAMES = ["a_b", "a?b", "a b", "a#b", "a/b", "..", ".", "_", "", ".a", "a.", "%2e%2e", "a\tb", "é", "e", "a~b",
         "x" * 100, "x" * 101, "x" * 100 + "y", "A_B", "a-b", "sp_ace~0123456789abcdef"]


def test_each_name_has_a_directory_of_its_own():
    segments = {name: path_segment(name) for name in NAMES}
    for a, b in itertools.combinations(NAMES, 2):
        assert segments[a] != segments[b], (a, b)


@pytest.mark.parametrize("name", NAMES)
def test_a_segment_is_a_safe_directory_name(name):
    segment = path_segment(name)
    assert segment not in ("", ".", "..") and "/" not in segment and len(segment) <= 120
    assert unsafe_location(f"file:///wh/{segment}") is None
    assert path_segment(segment) == segment or "~" in segment   # safe names map to themselves


def test_a_prefix_and_a_namespace_level_are_different_directories():
    catalog = IcebergService.__new__(IcebergService)
    catalog.services = SimpleNamespace(config=SimpleNamespace(warehouse_uri="file:///wh"),
                                       warehouses=Warehouses(Config(warehouse="/wh"), None, FileIO(), []))
    with_prefix = catalog.namespace_dir(TableIdent("x", ("n",), "t"))
    without = catalog.namespace_dir(TableIdent("", ("x", "n"), "t"))
    assert with_prefix != without and not with_prefix.startswith(without) and not without.startswith(with_prefix)
