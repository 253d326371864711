"""Lance's one error translation: any error raised while serving a Lance path, as the spec's ErrorResponse
(`{"error", "code", "detail", "instance"}`), with its codes 0-23 and the HTTP status the spec maps each code to,
chosen by the error's class."""

from __future__ import annotations

from quart import Response
from werkzeug.exceptions import HTTPException

from coordinator.errors import (AlreadyExists, BadRequest, CommitConflict, CoordinatorError, Forbidden, NamespaceExists,
                                NoSuchNamespace, NoSuchTransaction, NoSuchVersion, NotEmpty, NotFound, OutcomeUnknown,
                                TooManyRequests, Unauthorized, Unavailable, Unpublished, Unsupported, from_storage)

from ..common import json_response
from ..error_map import ErrorMap

# Spec, "Error Code to HTTP Status Mapping".
STATUS_OF_CODE = {0: 406, 1: 404, 2: 409, 3: 409, 4: 404, 5: 409, 6: 404, 7: 409, 8: 404, 9: 409, 10: 404,
                  11: 404, 12: 404, 13: 400, 14: 409, 15: 403, 16: 401, 17: 503, 18: 500, 19: 409, 20: 400,
                  21: 429, 22: 404, 23: 409}


def _code(cls: type[CoordinatorError], code: int) -> tuple[type[CoordinatorError], int, int]:
    return cls, STATUS_OF_CODE[code], code


# The spec's code for each class, the most specific first; any other error is 18 (an internal error).
ERRORS: ErrorMap[int] = ErrorMap(
    rows=(_code(Unsupported, 0),
          _code(NoSuchNamespace, 1), _code(NoSuchVersion, 11), _code(NoSuchTransaction, 10),
          _code(NotFound, 4),   # the table
          _code(NamespaceExists, 2), _code(AlreadyExists, 5),
          _code(NotEmpty, 3),
          _code(CommitConflict, 14),
          _code(BadRequest, 13),
          _code(Unauthorized, 16),
          _code(Forbidden, 15),
          _code(TooManyRequests, 21),
          _code(Unavailable, 17)),
    fault=(STATUS_OF_CODE[18], 18),
    otherwise=(STATUS_OF_CODE[18], 18))


def _detail(exc: CoordinatorError) -> str:
    """Whether the request changed anything: the one thing a client must know to recover."""
    if isinstance(exc, OutcomeUnknown):
        return "the commit may or may not have been applied: describe the version to find out"
    if isinstance(exc, Unpublished):
        return "the commit was recorded but its manifest is not in place yet; retry the same request"
    if isinstance(exc, Unavailable):
        return "nothing was applied; retry"
    return "nothing was applied"


def _error(message: str, code: int, detail: str, path: str, headers: dict[str, str] | None = None) -> Response:
    body = {"error": message, "code": code, "detail": detail, "instance": path}
    return json_response(body, STATUS_OF_CODE[code], headers)


def error_response(exc: BaseException, req) -> Response:
    """Any error raised while serving a Lance path (`req`, its method and path), as the spec's ErrorResponse: the
    one translation for this protocol (api/app.py sends every error here by the request's path)."""
    exc = from_storage(exc)
    if isinstance(exc, HTTPException):
        return _http_error_response(exc, req.path)
    headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, Unavailable) else None
    return _error(exc.message, ERRORS(exc)[1], _detail(exc), req.path, headers)


def _http_error_response(exc: HTTPException, path: str) -> Response:
    status = exc.code or 400
    if status >= 500:  # an unexpected fault (quart turns any uncaught exception into a 500): not the client's input
        return _error(exc.description or exc.name, 18, "an internal error; whether anything was applied is unknown: "
                      "describe the table or version to find out", path)
    return _error(exc.description or exc.name, {404: 4, 405: 0, 413: 13}.get(status, 13), "nothing was applied", path)
