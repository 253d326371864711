"""api/dependencies.py: the libraries whose private parts the service replaces or reads are bounded in
pyproject.toml, and an installed version outside those bounds, or one that lacks a private part a module checks for
at import (storage/libraries.py), stops `coordinator serve` at start, in one line that names the supported
versions, before it starts a database or takes a request."""

from __future__ import annotations

import subprocess
import sys

import pytest

from packaging.utils import canonicalize_name

from api.dependencies import PRIVATE_PARTS_USED, check_tested_versions, library_bounds

# `coordinator serve`, with importlib.metadata reporting an untested quart.
SERVE_WITH_UNTESTED_QUART = """
import sys
from importlib import metadata
real = metadata.version
metadata.version = lambda name: "0.99.0" if name.lower() == "quart" else real(name)
from api.cli import main
sys.exit(main(["serve", "--port", "0", "--data-dir", sys.argv[1]]))
"""


def test_each_library_is_bounded_and_the_installed_versions_are_within_the_bounds():
    bounds = library_bounds()
    assert {canonicalize_name(r.name) for r in bounds} == PRIVATE_PARTS_USED
    assert not any(r.specifier.contains("999") for r in bounds), "each bound needs an upper limit"
    check_tested_versions()


def test_an_untested_version_stops_the_service_at_start_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-c", SERVE_WITH_UNTESTED_QUART, str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1, result.stderr
    line = result.stderr
    assert line.startswith("coordinator: untested quart 0.99.0 installed"), line
    for name in PRIVATE_PARTS_USED:
        assert f" {name}<" in line or f" {name}>" in line, (name, line)   # each supported range is named
    assert not (tmp_path / "data").exists(), "a database was started before the refusal"


# `coordinator serve`, with pydantic's BaseModel lacking a slot coordinator/cluster/wire.py sets.
SERVE_WITHOUT_A_PYDANTIC_SLOT = """
import sys
import pydantic
pydantic.BaseModel.__slots__ = tuple(s for s in pydantic.BaseModel.__slots__ if s != "__pydantic_private__")
from api.cli import main
sys.exit(main(["serve", "--port", "0", "--data-dir", sys.argv[1]]))
"""


def test_each_private_part_read_is_there_and_a_missing_one_is_named_with_the_supported_versions():
    """pydantic's model state (coordinator/cluster/wire.py) and asyncpg's error texts (storage/connections.py) are
    checked at import: here against what is installed, and against a release that lacks them."""
    import pydantic

    from coordinator.cluster import wire
    from storage import connections
    from storage.libraries import UntestedLibrary, require

    probe = wire._Probe()
    assert wire.model_state_missing(pydantic.BaseModel.__slots__, probe.__getstate__()) == []
    assert connections.unsent_texts_missing() == []
    assert wire.model_state_missing(("__dict__",), {"__dict__": {}}) == [
        "BaseModel.__pydantic_extra__", "BaseModel.__pydantic_fields_set__", "BaseModel.__pydantic_private__"]
    assert connections.unsent_texts_missing("raise InternalClientError('not connected')") == [
        "the error text 'cannot switch to '"]
    with pytest.raises(UntestedLibrary) as refused:
        require("asyncpg", "storage/connections.py", connections.unsent_texts_missing(""))
    line = str(refused.value)
    assert "\n" not in line and line.startswith("asyncpg ") and " asyncpg>=" in line and "<" in line, line


def test_a_missing_private_part_stops_the_service_at_start_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-c", SERVE_WITHOUT_A_PYDANTIC_SLOT, str(tmp_path / "data")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("coordinator: pydantic ") and "BaseModel.__pydantic_private__" in result.stderr
    assert " pydantic>=" in result.stderr and ",<" in result.stderr, result.stderr   # the supported range
    assert not (tmp_path / "data").exists(), "a database was started before the refusal"
