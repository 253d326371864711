"""The storage interfaces (storage/interface.py) are what PostgresStore and FileIO offer: every method of every
Protocol exists on the class, with the same parameters (names, kinds, defaults) and the same sync/async kind."""

from __future__ import annotations

import inspect

import pytest

from storage import interface
from storage.files import FileIO
from storage.leases import LeaseStore
from storage.postgres import PostgresStore


def _methods(protocol: type) -> dict[str, object]:
    found = {}
    for klass in reversed(protocol.__mro__):
        if klass is object or klass.__name__ in ("Protocol", "Generic"):
            continue
        for name, value in vars(klass).items():
            if inspect.isfunction(value) and not name.startswith("_"):
                found[name] = value
    return found


def _shape(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("protocol, implementation", [
    (interface.Store, PostgresStore), (interface.Leases, LeaseStore), (interface.Files, FileIO)])
def test_the_implementation_has_every_method_of_its_interface(protocol, implementation):
    methods = _methods(protocol)
    assert methods, protocol
    for name, declared in methods.items():
        actual = getattr(implementation, name, None)
        assert actual is not None, f"{implementation.__name__} lacks {name}"
        assert _shape(actual) == _shape(declared), f"{implementation.__name__}.{name}: parameters differ"
        assert inspect.iscoroutinefunction(actual) == inspect.iscoroutinefunction(declared), name


def test_the_store_exposes_its_leases():
    assert "leases" in interface.Store.__annotations__
    store = PostgresStore("postgresql://unused")   # not opened: nothing connects
    assert isinstance(store.leases, LeaseStore)


def test_the_interface_names_only_storage_types():
    source = inspect.getsource(interface)
    assert "asyncpg" not in source.replace("no asyncpg", "")
    assert "coordinator" not in source.split('"""', 2)[2]
