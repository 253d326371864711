"""Unity Catalog's one error translation: any error raised while serving a Unity Catalog path, as UC's error body
(`{"error_code", "message", "details"}`), with the seed's codes, chosen by the error's class."""

from __future__ import annotations

from quart import Response
from werkzeug.exceptions import HTTPException

from coordinator.errors import (AlreadyExists, CatalogExists, CommitConflict, FailedPrecondition,
                                Forbidden, NamespaceExists, NamespaceNotEmpty, NoSuchCatalog, NoSuchNamespace, NotEmpty,
                                NotFound, OutcomeUnknown, TooManyRequests, Unauthorized, Unavailable, from_storage)

from ..common import json_response
from ..error_map import ErrorMap

# Classes before their parents: the first that matches gives the status and UC code.
ERRORS: ErrorMap[str] = ErrorMap(
    rows=((NoSuchCatalog, 404, "CATALOG_DOES_NOT_EXIST"),
          (NoSuchNamespace, 404, "SCHEMA_DOES_NOT_EXIST"),   # a UC schema is a namespace
          (NotFound, 404, "TABLE_DOES_NOT_EXIST"),
          (CatalogExists, 409, "CATALOG_ALREADY_EXISTS"),
          (NamespaceExists, 409, "SCHEMA_ALREADY_EXISTS"),
          (AlreadyExists, 400, "TABLE_ALREADY_EXISTS"),       # the seed gives 400 for this one
          (NamespaceNotEmpty, 400, "SCHEMA_NOT_EMPTY"),
          (NotEmpty, 400, "CATALOG_NOT_EMPTY"),
          (CommitConflict, 409, "ALREADY_EXISTS"),
          (TooManyRequests, 429, "RESOURCE_EXHAUSTED"),
          (Unavailable, 503, "TEMPORARILY_UNAVAILABLE"),
          (OutcomeUnknown, 500, "INTERNAL_ERROR"),
          (Unauthorized, 401, "UNAUTHENTICATED"),
          (Forbidden, 403, "PERMISSION_DENIED"),
          (FailedPrecondition, 400, "FAILED_PRECONDITION")),
    fault=(None, "INTERNAL_ERROR"),   # (e.g. a peer member's, over the channel): the outcome is unknown
    otherwise=(400, "INVALID_PARAMETER_VALUE"))


def uc_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    details = [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": code, "domain": "unitycatalog"}]
    return json_response({"error_code": code, "message": message, "details": details}, status, headers)


def error_response(exc: BaseException, req=None) -> Response:
    """Any error raised while serving a Unity Catalog path, as UC's error body: the one translation for this protocol
    (api/app.py sends every error here by the request's path; UC's body does not name the request, `req`)."""
    exc = from_storage(exc)
    if isinstance(exc, HTTPException):
        return _http_error_response(exc)
    status, code = ERRORS(exc)
    if isinstance(exc, OutcomeUnknown):
        message = f"the commit's outcome is unknown; read the table's commits before retrying: {exc.message}"
    else:
        message = exc.message
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Unavailable) else None
    return uc_error(status, code, message, headers)


# Statuses the framework raises itself (no route, bad method, body too large or too slow, and any exception no
# handler knew, which quart turns into a 500), each with the UC code a client reads it by. 404 is the code the
# catch-all route (routes.py) gives the same case. Any other 5xx is a server fault, never INVALID_PARAMETER_VALUE: a client
# must not take it for its own bad input and give up on a request that may be worth retrying.
_HTTP_CODES = {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "ENDPOINT_NOT_FOUND", 405: "METHOD_NOT_ALLOWED",
               429: "RESOURCE_EXHAUSTED", 501: "NOT_IMPLEMENTED", 503: "TEMPORARILY_UNAVAILABLE",
               504: "DEADLINE_EXCEEDED"}


def _http_error_code(status: int) -> str:
    return _HTTP_CODES.get(status) or ("INTERNAL_ERROR" if status >= 500 else "INVALID_PARAMETER_VALUE")


def _http_error_response(exc: HTTPException) -> Response:
    # Framework-raised errors in the protocol's shape too. A 500's description is werkzeug's generic sentence, so
    # nothing of the failure's internals reaches the client (quart has logged the exception).
    status = exc.code or 400
    return uc_error(status, _http_error_code(status), exc.description or exc.name)
