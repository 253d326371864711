"""Unity Catalog's Delta API v1.0 error model (the spec, "Error Response Body"): `{"error": {"type", "code",
"message"}}`, the type one of delta.yaml's `DeltaErrorType`, chosen by the error's class."""

from __future__ import annotations

from quart import Response
from werkzeug.exceptions import HTTPException

from coordinator.delta.v1.errors import MalformedRequest, RequirementFailed, UnsupportedFormat
from coordinator.errors import (AlreadyExists, CommitConflict, Forbidden, NoSuchCatalog, NoSuchNamespace,
                                NoSuchRoute, NoSuchTable, NotFound, OutcomeUnknown, TooManyRequests, Unauthorized,
                                Unavailable, from_storage)

from ...common import empty_response, json_response
from ...error_map import ErrorMap

PREFIX = "/api/2.1/unity-catalog/delta/v1"

# Classes before their parents: the first that matches gives the status and type.
ERRORS: ErrorMap[str] = ErrorMap(
    rows=((MalformedRequest, 400, "BadRequestException"),
          (UnsupportedFormat, 400, "UnsupportedTableFormatException"),
          (NoSuchCatalog, 404, "NoSuchCatalogException"),
          (NoSuchNamespace, 404, "NoSuchSchemaException"),
          (NoSuchRoute, 404, "NotFoundException"),
          (NoSuchTable, 404, "NoSuchTableException"),
          (NotFound, 404, "NotFoundException"),
          (AlreadyExists, 409, "AlreadyExistsException"),
          # the spec tells the two conflicts apart: a requirement that failed, or the version taken by another
          (RequirementFailed, 409, "UpdateRequirementConflictException"),
          (CommitConflict, 409, "CommitVersionConflictException"),
          (TooManyRequests, 429, "ResourceExhaustedException"),   # the unbackfilled-commit limit
          (Unavailable, None, "InternalServerErrorException"),    # 503 + Retry-After: nothing applied
          (OutcomeUnknown, 500, "CommitStateUnknownException"),
          (Unauthorized, 401, "NotAuthorizedException"),
          (Forbidden, 403, "PermissionDeniedException")),
    fault=(None, "InternalServerErrorException"),
    otherwise=(None, "InvalidParameterValueException"))

# Statuses the framework raises itself (no route, bad method, body too large or too slow, a handler's unknown
# exception, which quart turns into a 500).
_HTTP_TYPES = {401: "NotAuthorizedException", 403: "PermissionDeniedException", 404: "NotFoundException",
               429: "TooManyRequestsException", 501: "NotImplementedException"}


def v1_error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": {"type": kind, "code": status, "message": message}}, status, headers)


def error_response(exc: BaseException, req=None) -> Response:
    """Any error raised while serving a `/delta/v1` path, in the v1 error model. A HEAD is answered without a
    body (the spec: tableExists answers 404 with none)."""
    exc = from_storage(exc)
    if isinstance(exc, HTTPException):
        status = exc.code or 400
        kind = _HTTP_TYPES.get(status) or ("InternalServerErrorException" if status >= 500 else "BadRequestException")
        response = v1_error(status, kind, exc.description or exc.name)
    else:
        status, kind = ERRORS(exc)
        message = exc.message
        if isinstance(exc, OutcomeUnknown):
            message = f"the commit's outcome is unknown; reload the table before retrying: {message}"
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, (Unavailable, TooManyRequests)) else None
        response = v1_error(status, kind, message, headers)
    if req is not None and req.method == "HEAD":
        kept = {k: v for k, v in response.headers.items() if k.lower() == "retry-after"}
        return empty_response(response.status_code, kept)
    return response
