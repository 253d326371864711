"""Libraries whose private parts the service overrides or reads, held to the versions it is tested with.

A module that relies on a library's private part says which, where it relies on it, and checks at import that
each still exists (`require`): a release that renamed or dropped one would otherwise fail request by request. The
library is also bounded in pyproject.toml to the releases the tests pass with, and api/dependencies.py refuses an
installed version outside those bounds before the service starts. Either way the refusal is one line that names
the supported versions (read back from this package's own metadata: they are written once, in pyproject.toml).

In the lowest layer, so that every layer's modules can use it.
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

DISTRIBUTION = "table-commit-coordinator"


class UntestedLibrary(ImportError):
    """An installed library lacks a private part the service relies on (one line, naming the supported versions)."""


def bounds(libraries: frozenset[str]) -> list[Requirement]:
    """pyproject.toml's requirements for `libraries` (none from a checkout that was never installed)."""
    try:
        declared = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return []
    requirements = [Requirement(line) for line in declared]
    return [r for r in requirements if canonicalize_name(r.name) in libraries
            and (r.marker is None or r.marker.evaluate({"extra": ""}))]


def described(requirement: Requirement) -> str:
    """`quart>=0.22,<0.24`, lower bound first."""
    return requirement.name + ",".join(map(str, sorted(requirement.specifier, key=lambda s: Version(s.version))))


def require(library: str, used_by: str, missing: list[str]) -> None:
    """Raise UntestedLibrary if any of the private parts `missing` (what a check of `used_by` did not find in the
    installed `library`) is there at all."""
    if not missing:
        return
    supported = ", ".join(map(described, bounds(frozenset({canonicalize_name(library)})))) or f"the {library} " \
        f"release pyproject.toml names"
    raise UntestedLibrary(f"{library} {metadata.version(library)} installed lacks {', '.join(missing)}, which "
                          f"{used_by} relies on; this service supports {supported} (`pip install -e .` installs it)")
