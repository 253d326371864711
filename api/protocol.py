"""The HTTP half of the format seam: what a format's protocol declares (`Protocol`).

Each protocol's package (`api/<name>/`) declares its `Protocol` in `protocol.py`, naming the format it serves
(`coordinator/<name>/format.py`): the blueprints its routes are on, its one error translation, how it reads a part
of a commit across formats (api/commits.py), and the routes served straight from their ASGI messages (api/direct.py).
api/protocols.py lists the protocols the service speaks; api/app.py builds the app from that list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from quart import Blueprint, Response

from coordinator.format import Format

if TYPE_CHECKING:
    from .common import CommitPart
    from .direct import DirectRoute


@dataclass(frozen=True)
class Protocol:
    format: Format
    blueprints: tuple[Blueprint, ...]
    # Every error raised while serving one of its paths, answered in its own error body (`req`: the request).
    error_response: Callable[[BaseException, Any], Response]
    # A part of a commit across formats, as its own commit's body (without "format") reads it.
    cross_format_part: Callable[[dict], CommitPart]
    direct: Mapping[str, DirectRoute] = field(default_factory=dict)   # by endpoint
    openapi: bool = False   # it serves its reference, api/openapi/<name>.yaml, at /openapi/<name>.yaml

    @property
    def name(self) -> str:
        return self.format.name

