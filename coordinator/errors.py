"""Format-neutral errors raised by the coordinator and its commit rules: one class per outcome a client can tell
apart, so that every protocol's translation (one place per protocol in `api/`) is a lookup by class.

Every error says two things a client needs: what went wrong (`message`, naming the field or object) and
whether the request changed anything. Nothing below `api/` knows about HTTP bodies; `status` is only the
HTTP status the class usually maps to.

    CoordinatorError
     ├── BadRequest            malformed or invalid input; nothing applied            (400)
     │    ├── Unsupported      an operation or option this service does not serve
     │    ├── Unprocessable    well-formed but contradictory                          (422)
     │    ├── FailedPrecondition  valid, but the object is not in a state that allows it
     │    └── LocationTaken    a table's location overlaps another's
     ├── Unauthorized (InvalidClient) / Forbidden                                     (401/403)
     ├── NotFound              the named object does not exist                        (404)
     │    └── NoSuchNamespace, NoSuchTable (NameMoved), NoSuchView, NoSuchCatalog, NoSuchVersion,
     │        NoSuchTransaction, NoSuchRoute
     ├── AlreadyExists         create of something that exists                        (409)
     │    └── NamespaceExists, TableExists, ViewExists, CatalogExists
     ├── NotEmpty              drop of a container that still holds objects           (409)
     │    └── NamespaceNotEmpty (NamespaceRefilled), CatalogNotEmpty
     ├── CommitConflict        a requirement / expected version did not hold          (409)
     │    └── VersionExists, Recount, VersionPublished
     ├── DuplicateRequest      an Idempotency-Key applied a moment ago                (409)
     ├── TooManyRequests       the client must act first (e.g. backfill)              (429)
     ├── Unavailable           overloaded or database down; known NOT applied         (503 + Retry-After)
     │    ├── Unpublished      applied, but a file it publishes is not written yet
     │    └── NotOwner         scale-out: another member owns the table now
     └── OutcomeUnknown        the write may or may not have applied                  (5xx, "state unknown")
          └── AppliedReplyLost applied, but the owner's answer was lost
"""

from __future__ import annotations

from storage import errors as storage_errors


class CoordinatorError(Exception):
    status = 500
    # In a commit of several parts (coordinator/transaction.py), the index of the part this refusal is about, as
    # the caller listed them; None for the commit as a whole.
    part: int | None = None

    def __init__(self, message: str, *, reload: bool = False):
        super().__init__(message)
        self.message = message
        # A rejection that shows storage holding what the table's state does not know of (a client saw it): the
        # actor reloads before its next request, and the format's loader reconciles the two.
        self.reload = reload

    def __str__(self) -> str:
        return self.message


class BadRequest(CoordinatorError):
    status = 400


class Unsupported(BadRequest):
    """An operation, option or branch this service does not serve (Lance: 406, code 0)."""


class Unprocessable(BadRequest):
    """Well-formed but contradictory, e.g. a property key both updated and removed: Iceberg's spec answers 422
    (UnprocessableEntityException) there. Nothing applied, as for any BadRequest."""

    status = 422


class FailedPrecondition(BadRequest):
    """Valid, but the object is not in a state that allows it (UC's FAILED_PRECONDITION)."""


class LocationTaken(BadRequest):
    """A new table whose location equals, contains or lies inside another table's or view's: refused, as dropping
    either would delete the other's files (and two commit authorities would write one directory)."""

    def __init__(self, location: str | None = None):
        what = f"location {location}" if location else "the new location"
        super().__init__(f"{what} overlaps another table's location (or a dropped table's, whose files are still "
                         f"being deleted): a table's location must be its own, neither inside nor containing "
                         f"another's; choose another location, or retry once the deletion has ended")


class Unauthorized(CoordinatorError):
    status = 401


class InvalidClient(Unauthorized):
    """OAuth2 client credentials that are wrong (the token endpoint's `invalid_client`)."""


class Forbidden(CoordinatorError):
    status = 403


class NotFound(CoordinatorError):
    status = 404


class NoSuchNamespace(NotFound):
    """A namespace (Unity Catalog: a schema) that does not exist."""


class NoSuchTable(NotFound):
    pass


class NameMoved(NoSuchTable):
    """A cached name's table id now belongs to another name (renamed): resolve the name again."""


class NoSuchView(NotFound):
    pass


class NoSuchCatalog(NotFound):
    pass


class NoSuchVersion(NotFound):
    pass


class NoSuchTransaction(NotFound):
    pass


class NoSuchRoute(NotFound):
    """No route matched the path."""


class AlreadyExists(CoordinatorError):
    status = 409


class NamespaceExists(AlreadyExists):
    pass


class TableExists(AlreadyExists):
    pass


class ViewExists(AlreadyExists):
    pass


class CatalogExists(AlreadyExists):
    pass


class NotEmpty(CoordinatorError):
    status = 409


class NamespaceNotEmpty(NotEmpty):
    pass


class NamespaceRefilled(NamespaceNotEmpty):
    """A cascading drop found tables created in the namespace while it was being dropped."""


class CatalogNotEmpty(NotEmpty):
    pass


class CommitConflict(CoordinatorError):
    """A commit's requirement or expected version did not hold against the current state; nothing applied."""

    status = 409


class VersionExists(CommitConflict):
    """Lance: the version a client tried to create exists (or is not the next one)."""


class Recount(CommitConflict):
    """Lance: the table's versions changed while their records were counted; counted again, it may apply."""


class VersionPublished(CommitConflict):
    """Delta: the version was ratified and published long enough ago to have left the table's memory; the catalog
    reads the stored log to tell a replay of that very commit from a conflict."""


class TooManyRequests(CoordinatorError):
    status = 429

    def __init__(self, message: str, *, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EventsExpired(CoordinatorError):
    """The commit feed no longer holds the events after a reader's position: retention deleted them."""

    status = 410


class Unavailable(CoordinatorError):
    """Known not applied, safe to retry: full mailbox, database down before the write began, owner moving."""

    status = 503

    def __init__(self, message: str, *, retry_after_s: int = 1, reload: bool = False):
        super().__init__(message, reload=reload)
        self.retry_after_s = retry_after_s


class Unpublished(Unavailable):
    """Applied, but a file it publishes (Decision.published) could not be written yet. Still safe to retry: the
    table's next load restores the file, and the retry is answered as the same commit."""


class NotOwner(Unavailable):
    """Scale-out: this member does not (or no longer) own the table's shard; nothing applied. A member that
    forwarded the request retries at the current owner; a client that sees it retries after Retry-After."""


class OutcomeUnknown(CoordinatorError):
    """The write was sent but its result was lost (connection dropped mid-commit). Clients must re-check."""

    status = 500


class AppliedReplyLost(OutcomeUnknown):
    """Scale-out: the owner made the request durable (its receipt is in the store) and failed before answering.
    The change is known applied; a catalog that can rebuild the answer from the store does, so the client hears
    success rather than "state unknown"; anywhere else it stays a 5xx unknown."""


class DuplicateRequest(CoordinatorError):
    """A request whose Idempotency-Key the table's owner has just applied (the same key sent again, through
    another member, while the first was in flight). Nothing applied twice: the caller answers with the first
    request's recorded answer."""

    status = 409

    def __init__(self, key, message: str = "request already applied under this Idempotency-Key"):
        super().__init__(message)
        self.key = key


# What each error of the store and the file IO means for a client: every class of storage/errors.py is named here
# on purpose (tests/test_grant_reach_auth.py checks that none is left out), so that a new one cannot quietly take
# its parent's meaning or a guess. The first class of the error's MRO found here wins.
STORAGE_MEANINGS: dict[type[storage_errors.StorageError], type[CoordinatorError]] = {
    storage_errors.StoreUnavailable: Unavailable,       # known not applied
    storage_errors.DatabaseUnreachable: Unavailable,    # at start-up: nothing was asked of it
    storage_errors.OutcomeLost: OutcomeUnknown,
    storage_errors.NamespaceMissing: NoSuchNamespace,
    storage_errors.NamespaceExists: NamespaceExists,
    storage_errors.NamespaceRefilled: NamespaceRefilled,
    storage_errors.NamespaceNotEmpty: NamespaceNotEmpty,
    storage_errors.FileMissing: NotFound,
    storage_errors.FileRefused: BadRequest,
    storage_errors.FileTaken: BadRequest,
    # A storage error no class above describes says nothing of whether a write applied.
    storage_errors.StorageError: OutcomeUnknown,
}


def from_storage(exc: BaseException) -> BaseException:
    """The coordinator's error for what the store or the file IO raised (anything else as it is): the one place
    where storage's errors get their meaning for clients."""
    if not isinstance(exc, storage_errors.StorageError):
        return exc
    meaning = next(STORAGE_MEANINGS[c] for c in type(exc).__mro__ if c in STORAGE_MEANINGS)
    return meaning(exc.message)
