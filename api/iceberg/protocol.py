"""The Iceberg REST Catalog protocol as the app knows it (api/protocol.py): the format it serves, its routes (and
the same read routes over Unity Catalog's Delta tables), its error translation, its part of a commit across
formats; its direct routes are declared with them."""

from coordinator.iceberg.format import ICEBERG as FORMAT

from ..protocol import Protocol
from . import uniform
from .errors import error_response
from .routes import bp, cross_format_part

ICEBERG = Protocol(FORMAT, paths=("/v1/", uniform.MOUNT + "/"), blueprints=(bp, uniform.bp),
                   error_response=error_response, cross_format_part=cross_format_part, openapi=True)
