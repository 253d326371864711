"""Format-neutral errors raised by the coordinator and its commit rules.

Every error says two things a client needs: what went wrong (`message`, naming the field or object) and
whether the request changed anything. Each protocol module in `api/` translates these once, at its boundary,
into its own status code and body; nothing below `api/` knows about HTTP bodies.

    CoordinatorError
     ├── BadRequest            malformed or invalid input; nothing applied            (400)
     ├── Unauthorized/Forbidden                                                     (401/403)
     ├── NotFound              the named object does not exist                        (404)
     ├── AlreadyExists         create of something that exists                        (409)
     ├── NotEmpty              drop of a container that still holds objects           (409)
     ├── CommitConflict        a requirement / expected version did not hold          (409)
     ├── TooManyRequests       the client must act first (e.g. backfill)              (429)
     ├── Unavailable           overloaded or database down; known NOT applied         (503 + Retry-After)
     │    └── Unpublished      applied, but a file it publishes is not written yet    (503 + Retry-After)
     └── OutcomeUnknown        the write may or may not have applied                  (5xx, "state unknown")
"""

from __future__ import annotations


class CoordinatorError(Exception):
    status = 500

    def __init__(self, message: str, *, kind: str | None = None, reload: bool = False):
        super().__init__(message)
        self.message = message
        # `kind` refines the error for protocols that have finer codes, e.g. NotFound(kind="namespace").
        self.kind = kind
        # A rejection that shows storage holding what the table's state does not know of (a client saw it): the
        # actor reloads before its next request, and the format's loader reconciles the two.
        self.reload = reload

    def __str__(self) -> str:
        return self.message


class BadRequest(CoordinatorError):
    status = 400


class Unauthorized(CoordinatorError):
    status = 401


class Forbidden(CoordinatorError):
    status = 403


class NotFound(CoordinatorError):
    status = 404


class AlreadyExists(CoordinatorError):
    status = 409


class NotEmpty(CoordinatorError):
    status = 409


class CommitConflict(CoordinatorError):
    """A commit's requirement or expected version did not hold against the current state; nothing applied."""

    status = 409


class TooManyRequests(CoordinatorError):
    status = 429


class Unavailable(CoordinatorError):
    """Known not applied, safe to retry: full mailbox, database down before the write began, owner moving."""

    status = 503

    def __init__(self, message: str, *, retry_after_s: int = 1, kind: str | None = None, reload: bool = False):
        super().__init__(message, kind=kind, reload=reload)
        self.retry_after_s = retry_after_s


class Unpublished(Unavailable):
    """Applied, but a file it publishes (actor.Decision.published) could not be written yet. Still safe to
    retry: the table's next load restores the file, and the retry is answered as the same commit."""


class OutcomeUnknown(CoordinatorError):
    """The write was sent but its result was lost (connection dropped mid-commit). Clients must re-check."""

    status = 500


class AppliedReplyLost(OutcomeUnknown):
    """Scale-out: the owner made the request durable (its receipt is in the store) and failed before answering.
    The change is known applied; a catalog that can rebuild the answer from the store does, so the client hears
    success rather than "state unknown"; anywhere else it stays a 5xx unknown."""


class NotOwner(Unavailable):
    """Scale-out: this member does not (or no longer) own the table's shard; nothing applied. A member that
    forwarded the request retries at the current owner; a client that sees it retries after Retry-After."""


class DuplicateRequest(CoordinatorError):
    """A request whose Idempotency-Key the table's owner has just applied (the same key sent again, through
    another member, while the first was in flight). Nothing applied twice: the caller answers with the first
    request's recorded answer."""

    status = 409

    def __init__(self, key, message: str = "request already applied under this Idempotency-Key"):
        super().__init__(message, kind="duplicate")
        self.key = key


def location_taken(location: str | None) -> BadRequest:
    """A new table whose location equals, contains or lies inside another table's or view's: refused, as dropping
    either would delete the other's files (and two commit authorities would write one directory)."""
    what = f"location {location}" if location else "the new location"
    return BadRequest(f"{what} overlaps another table's location (or a dropped table's, whose files are still "
                      f"being deleted): a table's location must be its own, neither inside nor containing "
                      f"another's; choose another location, or retry once the deletion has ended")
