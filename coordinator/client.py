"""A small client for orchestrators: commit to Iceberg, Delta and Lance tables atomically, in one request; follow
the commit feed, and wait for a table to reach a version.

    from coordinator.client import commit, iceberg_part, delta_part, lance_part

    results = commit("http://127.0.0.1:8181", [
        iceberg_part(["db"], "events", requirements=[...], updates=[...]),
        delta_part({"table_id": ..., "table_uri": ..., "commit_info": {...}}),
        lance_part(["db", "vectors"], {"version": 7, "manifest_path": "..."}),
    ])

Every part applies, or none does: `commit` returns one result per part, in order (Iceberg: its
`metadata-location`; Delta: `{}`; Lance: the version), or raises `CommitRefused` naming the part that was refused
and why, with nothing applied.

    from coordinator.client import events, wait_for

    for event in events("http://127.0.0.1:8181", after=saved_token):   # long-polls; resumes after its last page
        handle(event)
        saved_token = event["sequence"]                                 # resume right after this event

    wait_for("http://127.0.0.1:8181", "db.events", 5)   # returns the event of the commit that reached version 5

It uses only the standard library, so a pipeline can call it without this package's dependencies.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Iterator

from .keys import new_key

COMMIT_PATH = "/api/coordinator/v1/commit"
EVENTS_PATH = "/api/coordinator/v1/events"
RETRY_MAX_S = 10.0   # events() waits at most this long between attempts while the service cannot be reached


class CommitRefused(Exception):
    """The service refused the commit. `part` is the index of the refused part (None: the commit as a whole),
    `status` the HTTP status, `type` the protocol's error type or code; `applied` says whether anything applied
    (False for every refusal; None when the outcome is unknown, a 5xx other than 503)."""

    def __init__(self, status: int, error: dict[str, Any]):
        super().__init__(error.get("message") or f"HTTP {status}")
        self.status = status
        self.error = error
        self.part: int | None = error.get("part")
        self.type = error.get("type")
        self.applied: bool | None = False if status < 500 or status == 503 else None


def iceberg_part(namespace: list[str], name: str, *, requirements: list[dict], updates: list[dict],
                 prefix: str | None = None) -> dict[str, Any]:
    """An Iceberg `CommitTableRequest` for one table (in catalog `prefix`, if the service uses one)."""
    part: dict[str, Any] = {"format": "iceberg", "identifier": {"namespace": list(namespace), "name": name},
                            "requirements": requirements, "updates": updates}
    if prefix is not None:
        part["prefix"] = prefix
    return part


def delta_part(commit_request: dict[str, Any]) -> dict[str, Any]:
    """A Unity Catalog Delta commit (the body of `POST /api/2.1/unity-catalog/delta/preview/commits`)."""
    return {"format": "delta", **commit_request}


def lance_part(table_id: list[str], create_table_version: dict[str, Any]) -> dict[str, Any]:
    """A Lance `CreateTableVersionRequest` for the table `table_id`."""
    return {"format": "lance", **create_table_version, "id": list(table_id)}


def commit(base_url: str, parts: list[dict[str, Any]], *, token: str | None = None,
           idempotency_key: str | None = None, timeout_s: float = 60.0) -> list[Any]:
    """Commit `parts` atomically. To retry after a lost answer, pass the same `idempotency_key` (a UUIDv7 string,
    `coordinator.keys.new_key()`; one is made for a call that gives none): the retry is answered as the first
    attempt was, never applied twice."""
    body = json.dumps({"parts": parts}).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": idempotency_key or new_key()}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base_url.rstrip("/") + COMMIT_PATH, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())["results"]
    except urllib.error.HTTPError as exc:
        raise CommitRefused(exc.code, _error_of(exc)) from None


def _error_of(exc: urllib.error.HTTPError) -> dict[str, Any]:
    """The service's `{"error": {...}}` of an error answer (its text as the message, if it is not that)."""
    raw = exc.read()
    try:
        return json.loads(raw).get("error") or {}
    except ValueError:
        return {"message": raw.decode(errors="replace")[:500]}


class FeedError(Exception):
    """The service refused a feed request: `status` 410 (the token is older than the feed keeps: start again
    without `after`), 400 (a malformed token or query), 401/403 (credentials)."""

    def __init__(self, status: int, error: dict[str, Any]):
        super().__init__(error.get("message") or f"HTTP {status}")
        self.status = status
        self.error = error


def events(base_url: str, after: str | None = None, *, format: str | list[str] | None = None,
           table: str | list[str] | None = None, limit: int = 100, wait_s: float = 30.0, follow: bool = True,
           token: str | None = None) -> Iterator[dict[str, Any]]:
    """The commit feed's events after the token `after` (None: from the oldest kept), in order, as CloudEvents
    dicts. It long-polls for more (`wait_s` per request) until the caller stops, or (`follow=False`) until it has
    caught up. Each event's `sequence` is the token to resume right after it; nothing is missed or repeated. While
    the service cannot be reached (a restart, a 5xx) it retries from where it was; FeedError otherwise."""
    while True:
        page = events_page(base_url, after, format=format, table=table, limit=limit,
                           wait_s=wait_s if follow else 0.0, token=token)
        yield from page["events"]
        after = page["next"]
        if not follow and not page["events"]:
            return


def wait_for(base_url: str, table: str, version: int, *, format: str | None = None, timeout_s: float | None = None,
             after: str | None = None, token: str | None = None) -> dict[str, Any]:
    """Wait until `table` (its full dotted name, as events' `subject` spells it) has been created or committed at
    `version` or later, and return that event. The version is the one the feed reports: Delta's and Lance's commit
    version, for Iceberg the number in the metadata file's name. It looks from `after` (None: the oldest event
    kept, so a commit made before the call counts too). TimeoutError after `timeout_s`."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        wait = 30.0 if deadline is None else max(0.0, min(30.0, deadline - time.monotonic()))
        page = events_page(base_url, after, format=format, table=table, limit=1000, wait_s=wait, token=token,
                           deadline=deadline)
        for event in page["events"]:
            if event["type"].endswith((".created", ".committed")) and (event["data"].get("version") or 0) >= version:
                return event
        after = page["next"]
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"{table} did not reach version {version} within {timeout_s:g} s")


def events_page(base_url: str, after: str | None = None, *, format: str | list[str] | None = None,
                table: str | list[str] | None = None, limit: int = 100, wait_s: float = 0.0,
                token: str | None = None, deadline: float | None = None) -> dict[str, Any]:
    """One answer of the feed, `{"events": [...], "next": token}`: for a caller that keeps its own position,
    such as an orchestrator's sensor with a cursor. While the service cannot be reached or answers 5xx (reading
    changes nothing, so it is safe to repeat) it tries again, until `deadline` (time.monotonic(); None: for ever,
    TimeoutError then)."""
    listed = lambda v: [] if v is None else [v] if isinstance(v, str) else list(v)   # noqa: E731
    query = ([("limit", limit), ("wait", wait_s)] + [("format", f) for f in listed(format)]
             + [("table", t) for t in listed(table)] + ([("after", after)] if after else []))
    url = base_url.rstrip("/") + EVENTS_PATH + "?" + urllib.parse.urlencode(query)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    pause = 0.5
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=wait_s + 30) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise FeedError(exc.code, _error_of(exc)) from None
            problem: Exception = exc
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            problem = exc
        if deadline is not None and time.monotonic() + pause > deadline:
            raise TimeoutError(f"the commit feed at {base_url} cannot be read: {problem}")
        time.sleep(pause)
        pause = min(pause * 2, RETRY_MAX_S)
