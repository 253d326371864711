"""The Lance Namespace REST protocol as the app knows it (api/protocol.py): the format it serves, its routes, its
error translation, its part of a commit across formats; its direct routes are declared with them."""

from coordinator.lance.format import LANCE as FORMAT

from ..protocol import Protocol
from .errors import error_response
from .routes import bp, cross_format_part

LANCE = Protocol(FORMAT, paths=("/v1/table", "/v1/table/", "/v1/namespace/", "/v1/transaction/"), blueprints=(bp,),
                 error_response=error_response, cross_format_part=cross_format_part, openapi=True,
                 key_header="x-api-key")   # (its spec's identity header)
