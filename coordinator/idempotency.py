"""Idempotency-Key (Iceberg REST, seed 000): replay a finalized answer instead of running an operation twice.

Finalized and replayed: 200/201/204 and deterministic 4xx (409 included). Never stored: 5xx, 503 and 429 (the
outcome is unknown or the client is told to retry). A success's record is written by the operation itself, in
the same database transaction as the change it records (see `Decision.idempotency`, the store's namespace
methods); an error's record is written afterwards, since an error changed nothing. A second request with a key
still in flight waits for the first and then gets its answer.

A record is kept under its route: the operation and the target it was sent to (`bind`), so a key reused on
another table is refused like a key reused for another operation, never answered with the first table's answer.

Format-neutral: an error is recorded as what it is (its class in `coordinator.errors`, message and status: JSON
marked `RECORDED_ERROR`), and replayed by raising it again, so that the protocol's own error translation words the
answer, as it did the first time. Records written before that hold the protocol's error body itself; those are
handed back like any recorded answer (status and body bytes).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

import orjson
import trio

from storage.errors import StoreUnavailable
from storage.records import IdempotencyRecord

from . import errors
from .errors import BadRequest, CoordinatorError, DuplicateRequest, Unavailable, from_storage

log = logging.getLogger(__name__)

T = TypeVar("T")

LIFETIME_S = 30 * 60                 # advertised as `idempotency-key-lifetime`
RETAIN_S = 2 * LIFETIME_S            # kept at least this long (a grace period for clock skew), then purged
NEVER_FINAL = {429, 503}
RECORDED_ERROR = b'{"recorded-error":'   # how a record's body in the neutral error form begins


def parse_key(raw: str) -> uuid.UUID:
    """The key must be a UUIDv7 in string form (RFC 9562)."""
    try:
        key = uuid.UUID(raw)
    except ValueError:
        raise BadRequest(f"Idempotency-Key must be a UUID, got {raw!r}") from None
    if key.version != 7 or key.variant != uuid.RFC_4122:
        raise BadRequest(f"Idempotency-Key must be a UUIDv7, got version {key.version}")
    return key


@dataclass(frozen=True)
class IdempotencyKey:
    """A request's key and the route its answer is recorded under (`bind`). The operation writes its own record
    (in the transaction of its change), so the route travels with the key down to it."""

    key: uuid.UUID
    route: str

    def record(self, status: int, body: bytes | None = None, body_ref: str | None = None) -> IdempotencyRecord:
        return IdempotencyRecord(self.key, self.route, status, body, body_ref)


def bind(operation: str, target: str) -> str:
    """The route a record is kept under: `operation target`, in the store's one route column. Operation names
    have no space; the target is whatever identifies the object (a request path, percent-encoded)."""
    return f"{operation} {target}"


def _operation(route: str) -> str:
    return route.split(" ", 1)[0]


def _check_route(key: uuid.UUID, previous: IdempotencyRecord, route: str) -> None:
    # Records written before targets were bound name the operation alone: they still replay for it.
    if previous.route not in (route, _operation(route)):
        raise BadRequest(f"Idempotency-Key {key} was already used for a different operation or target "
                         f"({_operation(previous.route)})")


def error_record_body(exc: CoordinatorError) -> bytes:
    """An error in the neutral form: the nearest class of `coordinator.errors` it is (a subclass defined elsewhere
    replays as that class), its message and status."""
    name = next(c.__name__ for c in type(exc).__mro__ if getattr(errors, c.__name__, None) is c)
    recorded = {"class": name, "message": exc.message, "status": exc.status}
    if exc.part is not None:
        recorded["part"] = exc.part
    return RECORDED_ERROR + orjson.dumps(recorded) + b"}"


def recorded_error(body: bytes) -> CoordinatorError | None:
    """The error a record's body holds in the neutral form, as an exception to raise again; None for any other
    body (an answer, or an error recorded in a protocol's own words before this form existed)."""
    if not body.startswith(RECORDED_ERROR):
        return None
    recorded = orjson.loads(body)["recorded-error"]
    cls = getattr(errors, recorded["class"], None)
    if not (isinstance(cls, type) and issubclass(cls, CoordinatorError)):
        cls = CoordinatorError
    # Built without the class's own constructor: some (LocationTaken, DuplicateRequest) word their message or
    # take other arguments; the recorded message is the one the client heard.
    exc = cls.__new__(cls)
    CoordinatorError.__init__(exc, recorded["message"])
    if exc.status != recorded["status"]:
        exc.status = recorded["status"]
    exc.part = recorded.get("part")
    return exc


def _replay(previous: IdempotencyRecord) -> IdempotencyRecord:
    """An earlier request's record to answer with; an error it recorded is raised again."""
    if previous.status >= 400 and previous.body:
        exc = recorded_error(bytes(previous.body))
        if exc is not None:
            raise exc
    return previous


class Idempotency:
    def __init__(self, store):
        self.store = store
        self._inflight: dict[uuid.UUID, trio.Event] = {}

    async def run(self, key: uuid.UUID, route: str, op: Callable[[], Awaitable[T]]) -> T | IdempotencyRecord:
        """`op()`'s result, or the finalized record of an earlier request with `key` to replay instead (an error
        it recorded is raised again, as the error it was). `route` is the operation, bound to its target (`bind`)
        where it has one."""
        while key in self._inflight:
            await self._inflight[key].wait()
        done = trio.Event()
        self._inflight[key] = done
        try:
            previous = await self.store.get_idempotency(key)
            if previous is not None:
                _check_route(key, previous, route)
                return _replay(previous)
            try:
                return await op()
            except DuplicateRequest:
                # The same key reached the table's owner through another member first: its answer is recorded.
                previous = await self.store.get_idempotency(key)
                if previous is None:
                    raise Unavailable(f"Idempotency-Key {key} was applied by a concurrent request whose answer "
                                      f"is not readable yet; retry") from None
                _check_route(key, previous, route)
                return _replay(previous)
            except Exception as raised:
                exc = from_storage(raised)   # (what the store refused is final too, e.g. a namespace that exists)
                if isinstance(exc, CoordinatorError) and 400 <= exc.status < 500 and exc.status not in NEVER_FINAL:
                    # A twin sent through another member (or coordinating a multi-table commit there) may have
                    # applied this very request just before: decided again, it fails (409: its requirements no
                    # longer hold against the state it made). Its record, if there is one, is the answer.
                    previous = await self.store.get_idempotency(key)
                    if previous is not None:
                        _check_route(key, previous, route)
                        return _replay(previous)
                    await self._record_error(key, route, exc.status, error_record_body(exc))
                raise
        finally:
            del self._inflight[key]
            done.set()

    async def _record_error(self, key: uuid.UUID, route: str, status: int, body: bytes) -> None:
        try:
            await self.store.put_idempotency(IdempotencyRecord(key, route, status, body))
        except (Unavailable, StoreUnavailable) as exc:  # the error answer stands; a retry will simply run again
            log.warning("could not record idempotent error answer: %s", exc)
