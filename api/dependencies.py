"""The libraries whose private parts the service replaces, held to the versions it is tested with.

- quart, quart-trio, hypercorn: `api/transport.py` (quart-trio's message loop, Quart's request body, hypercorn's
  TCP server with its idle timer, and its HTTP/2 connection);
- werkzeug: `api/routing.py` (the matcher inside werkzeug's routing Map);
- pyiceberg: `coordinator/uniform/conversion.py` (its overwrite snapshot producer, `_OverwriteFiles`, driven directly
  for a conversion's deletes and rewrites).

A release of one of them may change those parts without notice, and the first sign would be requests failing one
by one. So pyproject.toml bounds each to the releases the tests pass with, and the service checks the installed
versions against those bounds (read back from its own package metadata: they are written once) before it starts,
refusing an untested one in one line that names the supported versions.
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from coordinator.config import ConfigError

DISTRIBUTION = "table-commit-coordinator"
PRIVATE_PARTS_USED = frozenset({"quart", "quart-trio", "hypercorn", "werkzeug", "pyiceberg"})


def library_bounds() -> list[Requirement]:
    """pyproject.toml's requirements for the libraries above (none from a checkout that was never installed)."""
    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    requirements = [Requirement(line) for line in declared]
    return [r for r in requirements if canonicalize_name(r.name) in PRIVATE_PARTS_USED
            and (r.marker is None or r.marker.evaluate({"extra": ""}))]


def check_tested_versions() -> None:
    """Raise ConfigError, naming the supported versions, if an installed library above is outside its bounds."""
    bounds = library_bounds()
    untested = [f"{r.name} {metadata.version(r.name)}" for r in bounds
                if not r.specifier.contains(metadata.version(r.name), prereleases=True)]
    if untested:
        supported = ", ".join(map(_described, bounds))
        raise ConfigError(f"untested {' and '.join(untested)} installed; this service supports {supported} "
                          f"(`pip install -e .` installs them)")


def _described(requirement: Requirement) -> str:
    """`quart>=0.22,<0.24`, lower bound first."""
    return requirement.name + ",".join(map(str, sorted(requirement.specifier, key=lambda s: Version(s.version))))
