"""Iceberg's one error translation: any error raised while serving an Iceberg path, as the spec's
`IcebergErrorResponse` (`{"error": {"message", "type", "code"}}`), chosen by the error's class."""

from __future__ import annotations

import orjson
from quart import Response
from werkzeug.exceptions import HTTPException

from coordinator.errors import (AlreadyExists, BadRequest, CommitConflict, Forbidden, NoSuchCatalog,
                                NoSuchNamespace, NoSuchRoute, NoSuchView, NotEmpty, NotFound, OutcomeUnknown,
                                TooManyRequests, Unauthorized, Unavailable, Unprocessable, Unsupported, from_storage)

from coordinator.warehouses import NoSuchWarehouse

from ..common import framework_error_message, json_response
from ..error_map import ErrorMap

# The spec's error type for each class, the most specific first: the first class an error is an instance of wins.
# Its status is the class's own, but for an operation the server does not serve: 406 (Not Acceptable, the spec's
# "UnsupportedOperationResponse").
ERRORS: ErrorMap[str] = ErrorMap(
    rows=((NoSuchNamespace, None, "NoSuchNamespaceException"),
          (NoSuchView, None, "NoSuchViewException"),
          (NoSuchRoute, None, "NotFoundException"),
          (NoSuchWarehouse, None, "NotFoundException"),
          (NoSuchCatalog, None, "NotFoundException"),   # a Unity Catalog catalog, read as Iceberg (uniform.py)
          (NotFound, None, "NoSuchTableException"),
          (NotEmpty, None, "NamespaceNotEmptyException"),
          (AlreadyExists, None, "AlreadyExistsException"),
          (CommitConflict, None, "CommitFailedException"),
          (Unavailable, None, "ServiceUnavailableException"),
          (OutcomeUnknown, None, "CommitStateUnknownException"),
          (Unauthorized, None, "NotAuthorizedException"),
          (Forbidden, None, "ForbiddenException"),
          (TooManyRequests, None, "TooManyRequestsException"),
          (Unprocessable, None, "UnprocessableEntityException"),
          (Unsupported, 406, "UnsupportedOperationException")),
    fault=(None, "InternalServerError"),   # (e.g. a peer member's, over the channel): not the client's bad request
    otherwise=(None, "BadRequestException"))


def error_response(exc: BaseException, req) -> Response:
    """Any error raised while serving an Iceberg path (`req`, its method and path), as the spec's ErrorModel: the
    one translation for this protocol (api/app.py sends every error here by the request's path; an idempotent
    replay raises the error it recorded again)."""
    exc = from_storage(exc)
    if isinstance(exc, HTTPException):
        return _http_error_response(exc, req)
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Unavailable) else None
    status, kind = ERRORS(exc)
    body = orjson.dumps({"error": {"message": exc.message, "type": kind, "code": status}})
    return json_response(body, status, headers)


def _http_error_response(exc: HTTPException, req) -> Response:
    message = framework_error_message(exc, req)
    if (exc.code or 400) >= 500:  # a fault we did not foresee (quart's 500): not the client's bad request
        return json_response({"error": {"message": message, "type": "InternalServerError", "code": exc.code}},
                             exc.code)
    err = NoSuchRoute(message) if exc.code == 404 else BadRequest(message)
    err.status = exc.code or 400
    return error_response(err, req)
