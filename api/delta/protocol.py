"""Unity Catalog's API for Delta tables as the app knows it (api/protocol.py): the format it serves, its routes,
its error translation, its part of a commit across formats, its direct routes."""

from coordinator.delta.format import DELTA as FORMAT

from ..protocol import Protocol
from .errors import error_response
from .routes import DIRECT, bp, cross_format_part
from .v1 import routes as _v1_routes   # noqa: F401  (its routes are on `bp`)

DELTA = Protocol(FORMAT, blueprints=(bp,), error_response=error_response, cross_format_part=cross_format_part,
                 direct=DIRECT, openapi=True)
