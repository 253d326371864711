"""The HTTP half of the format seam: what a format's protocol declares (`Protocol`), and the protocols an app
speaks (`Protocols`).

Each protocol's package (`api/<name>/`) declares its `Protocol` in `protocol.py`, naming the format it serves
(`coordinator/<name>/format.py`): the request paths that are its own, the blueprints its routes are on, its one
error translation, how it reads a part of a commit across formats (api/commits.py). (Which of its routes are served
straight from their ASGI messages is declared with each route: api/direct.py.) api/protocols.py lists the protocols
the service speaks; api/app.py builds the app from such a list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator

from quart import Blueprint, Response

from coordinator.format import Format

if TYPE_CHECKING:
    from .common import CommitPart

# The service's own paths: its commits across formats and feed, and everything else (health, metrics, documents).
COORDINATOR_PATHS = "/api/coordinator/"
COORDINATOR, SERVICE = "coordinator", "service"


@dataclass(frozen=True)
class Protocol:
    format: Format
    # Its request paths: a path ending in "/" and everything below it, any other that path alone. The longest
    # that matches decides, whichever protocol declared it (Unity Catalog's Iceberg mount is Iceberg's).
    paths: tuple[str, ...]
    blueprints: tuple[Blueprint, ...]
    # Every error raised while serving one of its paths, answered in its own error body (`req`: the request).
    error_response: Callable[[BaseException, Any], Response]
    # A part of a commit across formats, as its own commit's body (without "format") reads it.
    cross_format_part: Callable[[dict], CommitPart]
    openapi: bool = False   # it serves its reference, api/openapi/<name>.yaml, at /openapi/<name>.yaml
    # A header that carries a bearer token too, besides Authorization (Lance's spec: `x-api-key`).
    key_header: str | None = None

    @property
    def name(self) -> str:
        return self.format.name


@dataclass(frozen=True)
class Protocols:
    """The protocols an app speaks, in order, and which one a request path belongs to (its errors are written in
    that protocol's format): a protocol's name, "coordinator" for the service's own API, or "service"."""

    all: tuple[Protocol, ...]
    by_name: dict[str, Protocol] = field(init=False)
    _exact: dict[str, str] = field(init=False)
    _prefixes: tuple[tuple[str, str], ...] = field(init=False)   # longest first

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {p.name: p for p in self.all})
        declared = [(path, p.name) for p in self.all for path in p.paths] + [(COORDINATOR_PATHS, COORDINATOR)]
        object.__setattr__(self, "_exact", {path: name for path, name in declared if not path.endswith("/")})
        object.__setattr__(self, "_prefixes", tuple(sorted(((path, name) for path, name in declared
                                                             if path.endswith("/")), key=lambda e: -len(e[0]))))

    def __iter__(self) -> Iterator[Protocol]:
        return iter(self.all)

    def of(self, path: str) -> str:
        found = self._exact.get(path)
        if found is not None:
            return found
        for prefix, name in self._prefixes:
            if path.startswith(prefix):
                return name
        return SERVICE

    def key_header(self, path: str) -> str | None:
        """The header besides Authorization that may carry the credential of a request to `path`, if any."""
        protocol = self.by_name.get(self.of(path))
        return protocol.key_header if protocol is not None else None
