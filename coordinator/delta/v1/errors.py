"""The outcomes of Unity Catalog's Delta API v1.0 that its error model tells apart beyond the coordinator's own
classes (coordinator/errors.py): api/delta/v1/errors.py gives each its spec error type."""

from __future__ import annotations

from ...errors import BadRequest, CommitConflict


class MalformedRequest(BadRequest):
    """The body is not the spec's shape (BadRequestException); a well-formed body whose values a rule refuses is
    a plain BadRequest (InvalidParameterValueException)."""


class RequirementFailed(CommitConflict):
    """An `assert-table-uuid` or `assert-etag` requirement, or UniForm's sequential validation, did not hold
    (UpdateRequirementConflictException): the client reloads the table. Nothing applied."""


class UnsupportedFormat(BadRequest):
    """The table is not one this API serves (UnsupportedTableFormatException): the client falls back to UC's
    table API."""
