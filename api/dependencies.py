"""The libraries whose private parts the service replaces or reads, held to the versions it is tested with.

- quart, quart-trio, hypercorn: `api/transport.py` (quart-trio's message loop, Quart's request body, hypercorn's
  TCP server with its idle timer, and its HTTP/2 connection);
- werkzeug: `api/routing.py` (the matcher inside werkzeug's routing Map);
- pyiceberg: `coordinator/uniform/conversion.py` (its overwrite snapshot producer, `_OverwriteFiles`, driven directly
  for a conversion's deletes and rewrites);
- pydantic: `coordinator/cluster/wire.py` (a model's state, as its `__getstate__` and `__setstate__` see it, read and
  set directly: four of `BaseModel`'s slots);
- asyncpg: `storage/connections.py` (the text of the errors asyncpg raises before it sends anything, which says
  that a statement was never sent).

A release of one of them may change those parts without notice, and the first sign would be requests failing one
by one. So pyproject.toml bounds each to the releases the tests pass with, and the service checks the installed
versions against those bounds (read back from its own package metadata: they are written once) before it starts,
refusing an untested one in one line that names the supported versions. The modules that read pydantic's and
asyncpg's parts also check at import that those parts are there (storage/libraries.py).
"""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement

from coordinator.config import ConfigError
from storage.libraries import bounds, described

PRIVATE_PARTS_USED = frozenset({"quart", "quart-trio", "hypercorn", "werkzeug", "pyiceberg", "pydantic", "asyncpg"})


def library_bounds() -> list[Requirement]:
    """pyproject.toml's requirements for the libraries above (none from a checkout that was never installed)."""
    return bounds(PRIVATE_PARTS_USED)


def check_tested_versions() -> None:
    """Raise ConfigError, naming the supported versions, if an installed library above is outside its bounds."""
    requirements = library_bounds()
    untested = [f"{r.name} {metadata.version(r.name)}" for r in requirements
                if not r.specifier.contains(metadata.version(r.name), prereleases=True)]
    if untested:
        supported = ", ".join(map(described, requirements))
        raise ConfigError(f"untested {' and '.join(untested)} installed; this service supports {supported} "
                          f"(`pip install -e .` installs them)")
