"""Helpers every protocol module shares: JSON in and out, pydantic validation errors that name the field."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from quart import Response, request

from coordinator.errors import BadRequest

M = TypeVar("M", bound=BaseModel)

JSON = "application/json"


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = value if isinstance(value, bytes) else orjson.dumps(value)
    return Response(body, status=status, content_type=JSON, headers=headers)


def empty_response(status: int = 204, headers: dict[str, str] | None = None) -> Response:
    return Response(b"", status=status, headers=headers)


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


async def read_json(allow_empty: bool = False) -> Any:
    data = await request.get_data()
    if not data:
        if allow_empty:
            return {}
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None


def parse_model(model: type[M], value: Any) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise BadRequest(f"invalid request: {describe_validation_error(exc)}") from None


async def read_model(model: type[M], allow_empty: bool = False) -> M:
    return parse_model(model, await read_json(allow_empty))
