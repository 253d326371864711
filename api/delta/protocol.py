"""Unity Catalog's API for Delta tables as the app knows it (api/protocol.py): the format it serves, its routes,
its error translation, its part of a commit across formats; its direct routes are declared with them."""

from coordinator.delta.format import DELTA as FORMAT

from ..protocol import Protocol
from .errors import error_response
from .routes import PREFIX, bp, cross_format_part

DELTA = Protocol(FORMAT, paths=(PREFIX, PREFIX + "/"), blueprints=(bp,), error_response=error_response,
                 cross_format_part=cross_format_part, openapi=True)
