"""Unity Catalog's API for Delta tables as the app knows it (api/protocol.py): the format it serves, its paths,
its routes, its error translation, its part of a commit across formats."""

from coordinator.delta.format import DELTA as FORMAT

from ..protocol import Protocol
from . import errors
from .routes import PREFIX, bp, cross_format_part
from .v1 import errors as v1_errors, routes as _v1_routes   # noqa: F401  (its routes are on `bp`)


def error_response(exc: BaseException, req=None):
    """Every error of a Unity Catalog path: the Delta API v1.0 has an error model of its own (v1/errors.py), the
    rest UC's (errors.py)."""
    if req is not None and req.path.startswith(v1_errors.PREFIX):
        return v1_errors.error_response(exc, req)
    return errors.error_response(exc, req)


DELTA = Protocol(FORMAT, paths=(PREFIX, PREFIX + "/"), blueprints=(bp,), error_response=error_response,
                 cross_format_part=cross_format_part, openapi=True)
