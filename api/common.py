"""Helpers every protocol module shares: JSON in and out, pydantic validation errors that name the field."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from quart import Response, g, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from coordinator.errors import BadRequest

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

JSON = "application/json"


# A JSON answer given in parts (Iceberg's metadata between its envelope) is sent part by part from this size on,
# instead of being joined: joining copies megabytes, while each extra part costs a send (~20 us) however small.
STREAM_PARTS_FROM = 256 * 1024


def json_response(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """`value` as JSON: bytes as they are, a list of bytes as their concatenation, anything else serialized."""
    if isinstance(value, list) and value and all(isinstance(part, bytes) for part in value):
        size = sum(map(len, value))
        if size >= STREAM_PARTS_FROM:
            return Response(_parts(value), status=status, content_type=JSON,
                            headers={**(headers or {}), "Content-Length": str(size)})
        value = b"".join(value)
    body = value if isinstance(value, bytes) else orjson.dumps(value)
    return Response(body, status=status, content_type=JSON, headers=headers)


async def _parts(parts: list[bytes]):
    for part in parts:
        yield part


def framework_error_message(exc: HTTPException, req) -> str:
    """A framework-raised error (no route, bad method, body too large or too slow) in words: what and where, and
    for a body refused, why (the limit it broke). `req`: the request (its `method` and `path`)."""
    message = f"{exc.name}: {req.method} {req.path}"
    if isinstance(exc, (RequestEntityTooLarge, RequestTimeout)):
        message = f"{message}: {exc.description}"
    return message


def refuse_nul(path: str, query_string: bytes) -> None:
    """A NUL (%00) can name nothing: PostgreSQL text cannot hold it and the OS cannot open a path with it. (h11
    refuses a raw NUL in the request line, so a query string can only hold it encoded.)"""
    if "\x00" in path or b"%00" in query_string:
        raise BadRequest("the path or a query parameter has a NUL character (%00)")


def body_timeout(seconds: float) -> RequestTimeout:
    return RequestTimeout(f"request body did not arrive within {seconds:g} s")


def empty_response(status: int = 204, headers: dict[str, str] | None = None) -> Response:
    response = Response(b"", status=status, headers=headers)
    del response.headers["Content-Type"]   # Quart's default (text/html) would describe a body there is none of
    return response


def describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err["loc"]) or "body"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


# Deepest nesting of arrays and objects a request body may have. orjson reads up to 1024 levels but writes at most
# 255, and what a request carries is written back (metadata files, jsonb, idempotent answers) a few levels deeper:
# a body deeper than that would be accepted and then fail to be stored, for every request batched with it. Real
# bodies are far shallower (an Iceberg schema nests 3 levels per struct).
MAX_JSON_DEPTH = 128
# Every integer in these protocols is a signed 64-bit one (Iceberg's long, Lance's and Unity Catalog's int64).
# orjson reads integers up to 2**64 - 1; one above 2**63 - 1 taken into a table's metadata would make the table
# unreadable to every Java client (Spark, Trino, Flink), so none is taken.
INT64_MAX = 2**63 - 1
_NINETEEN_DIGITS = re.compile(rb"\d{19,}")


def parse_json(data: bytes) -> Any:
    """A request body's JSON. orjson refuses numbers beyond a double and nesting deeper than 1024 levels (so a
    hostile body cannot exhaust the stack); nesting deeper than MAX_JSON_DEPTH is refused here. So is a NUL in
    a string: no name, property or path can hold one, PostgreSQL's text and jsonb cannot store one and the OS
    cannot open a path with one, so it would otherwise fail deep inside a commit. So is an object with a key
    twice (see _refuse_repeated_keys)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    # Cheap tests first: most bodies have no escaped NUL, no number of 19 digits and too few brackets to be deep.
    may_nest = data.count(b"[") + data.count(b"{") > MAX_JSON_DEPTH
    if may_nest or b"\\u0000" in data or _beyond_int64(data):
        _check_value(value)
    _refuse_repeated_keys(data, value)  # after the depth check: the stdlib scanner recurses
    return value


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> None:
    """One object's members: the first key seen twice is named. A set of the keys seen so far keeps the search
    linear in the object's size (a body of 20,000 distinct keys and one repeated is 165 KB)."""
    if len({key for key, _ in pairs}) == len(pairs):
        return
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen.add(key)


# The stdlib scanner hands each object's pairs over before they become a dict; orjson (like every dict-building
# parser) keeps the last of a repeated key silently. Values are built by orjson, so this pass builds nothing.
_KEY_CHECKER = json.JSONDecoder(object_pairs_hook=_unique_keys)


# A repeated key is named by the stdlib's scanner (below) in bodies up to this size (a commit's, mostly); a larger
# body is refused without its name: the scanner's pass costs some 30x orjson's parse on a body of many small
# members, and such a body, sent by a client granted nothing, would hold the service's core for as long.
NAME_REPEATED_KEY_UP_TO = 64 * 1024
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


def _refuse_repeated_keys(data: bytes, value: Any) -> None:
    """A JSON object with a key twice is refused: parsers disagree on which one counts (orjson, Python and Java
    take the last, others the first), so a proxy, an audit log or a second reader could see another request
    than the one applied, e.g. a commit's failing `requirements` placed first and an empty list last.

    Counted, in time linear in the body: in JSON text every `:` is an object member's or a character of a
    string, and orjson writes both back as they are. So if the text has as many colons as `value` written back,
    no member was dropped for a repeated key. A `\\u003a` escape may spell a colon in a string: then only the
    colons outside strings are counted, in both. Only when a member was dropped does the stdlib's scanner look,
    to name the key."""
    written = orjson.dumps(value)
    if b"\\u003" in data:
        dropped = _members(data) != _members(written)
    else:
        dropped = data.count(b":") != written.count(b":")
    if not dropped:
        return
    if len(data) > NAME_REPEATED_KEY_UP_TO:
        raise BadRequest("request body has a key twice in one object; send each key once")
    try:
        _KEY_CHECKER.decode(data.decode())
    except (ValueError, RecursionError) as exc:  # what orjson read, but not the stdlib: say it like orjson
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except _RepeatedKey as exc:
        raise BadRequest(f"request body has the key {exc.args[0]!r} twice in one object; send each key once") \
            from None
    raise BadRequest("request body has a key twice in one object; send each key once")


def _members(text: bytes) -> int:
    """The members of every object in JSON `text`: its colons outside strings."""
    return _JSON_STRING.sub(b"", text).count(b":")


def _beyond_int64(data: bytes) -> bool:
    """Whether any run of 19 or more digits (in a number or a string) exceeds INT64_MAX: only then can an integer
    be out of range. Iceberg snapshot ids have 19 digits and Delta's commit file names a zero-padded 20-digit
    version, both in range, so neither commit body is walked."""
    for run in _NINETEEN_DIGITS.findall(data):
        digits = run.lstrip(b"0")  # empty for a run of zeros, e.g. Delta's first commit 00000000000000000000.json
        if len(digits) > 19 or (len(digits) == 19 and int(digits) > INT64_MAX):
            return True
    return False


def _check_value(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                raise BadRequest("request body has a NUL character (\\u0000) in a string; names, properties and "
                                 "locations cannot contain one")
        elif isinstance(v, int) and v > INT64_MAX:
            raise BadRequest(f"request body has the integer {v}, beyond the signed 64-bit range of every integer "
                             f"in this API")
        elif isinstance(v, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise BadRequest(f"request body is nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(v, dict):
                stack.extend((k, depth) for k in v)
                stack.extend((x, depth + 1) for x in v.values())
            else:
                stack.extend((x, depth + 1) for x in v)


async def read_json(allow_empty: bool = False) -> Any:
    """The request body's JSON, parsed once per request: an access policy that reads part of it and the view share
    one parse."""
    return await parsed_once(("json", allow_empty), lambda: _read_json(allow_empty))


async def _read_json(allow_empty: bool) -> Any:
    return body_json(await request.get_data(), allow_empty)


def body_json(data: bytes, allow_empty: bool = False) -> Any:
    """A request body's JSON (`allow_empty`: an empty body reads as `{}`)."""
    if not data:
        if allow_empty:
            return {}
        raise BadRequest("request body is empty; expected a JSON object")
    return parse_json(data)


def json_model(model: type[M]) -> Callable[[Any], M]:
    """How a direct route (api/direct.py) reads its body as `model`, as `read_model` does."""
    return lambda req: parse_model(model, req.json())


def json_fields(model: type[BaseModel], *names: str) -> Callable[[Any], BaseModel]:
    """How a direct route reads the fields `names` of its body as `model` has them, as `read_fields` does."""
    return lambda req: parse_model(fields_of(model, *names), req.json())


@functools.cache
def fields_of(model: type[BaseModel], *names: str) -> type[BaseModel]:
    """`model` with only its fields `names` (their types, aliases and defaults), every other key ignored: what an
    access policy reads of a body. The policy validates only those, so the caller's grants are checked before
    the rest of the body is validated (by `model`, in the view)."""
    fields = {name: (info.annotation, info) for name, info in model.model_fields.items() if name in names}
    assert len(fields) == len(names), f"{model.__name__} has no field among {names}"
    config = ConfigDict(**{**model.model_config, "extra": "ignore"})
    return create_model(f"{model.__name__}Fields", __config__=config, **fields)


def parse_model(model: type[M], value: Any) -> M:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise BadRequest(f"invalid request: {describe_validation_error(exc)}") from None


async def parsed_once(key: Any, parse: Callable[[], Awaitable[T]]) -> T:
    """A request's parsed body, parsed once per request: a route whose access policy names its object from the
    body (a commit by table id, a multi-table commit) and its view share it instead of parsing it twice."""
    bodies = g.setdefault("parsed_bodies", {})
    if key not in bodies:
        bodies[key] = await parse()
    return bodies[key]


async def read_model(model: type[M], allow_empty: bool = False) -> M:
    return await parsed_once(model, lambda: _read_model(model, allow_empty))


async def _read_model(model: type[M], allow_empty: bool) -> M:
    return parse_model(model, await read_json(allow_empty))


async def read_fields(model: type[BaseModel], *names: str) -> Any:
    """The fields `names` of the request's body as `model` reads them (`fields_of`), for an access policy."""
    return await parsed_once((model, names), lambda: _read_fields(model, names))


async def _read_fields(model: type[BaseModel], names: tuple[str, ...]) -> Any:
    return parse_model(fields_of(model, *names), await read_json())


def query_flag(name: str, default: bool = False) -> bool:
    """A boolean query parameter: `true` or `false`, in any case. Anything else is refused before the request does
    anything: read as false (Java's `Boolean.parseBoolean`), a misspelt `purgeRequested` would drop a table and
    keep its files."""
    raw = request.args.get(name)
    if raw is None:
        return default
    if raw.lower() not in ("true", "false"):
        raise BadRequest(f"{name} must be true or false, got {raw!r}")
    return raw.lower() == "true"


@dataclass
class CommitPart:
    """One part of a cross-format commit (api/commits.py), as its protocol's module read it: what to call it in
    messages, the grants it needs (as that protocol's own commit needs them, read from only the fields that name
    its table), how its format's service plans it (`read()` validates the rest of the part, once the grants are
    checked, and returns the planner), and how that protocol words an error (its HTTP status, and its error
    type or code)."""

    label: str
    needs: Callable[[], Awaitable[list]]
    read: Callable[[], Callable[[], Awaitable[Any]]]
    error: Callable[[Any], tuple[int, str | int]]
