"""api/dependencies.py: the libraries whose private parts the service replaces are bounded in pyproject.toml, and
an installed version outside those bounds stops `coordinator serve` at start, in one line that names the
supported versions, before it starts a database or takes a request."""

from __future__ import annotations

import subprocess
import sys

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
