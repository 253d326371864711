"""A small client for orchestrators: commit to Iceberg, Delta and Lance tables atomically, in one request.

    from coordinator.client import commit, iceberg_part, delta_part, lance_part

    results = commit("http://127.0.0.1:8181", [
        iceberg_part(["db"], "events", requirements=[...], updates=[...]),
        delta_part({"table_id": ..., "table_uri": ..., "commit_info": {...}}),
        lance_part(["db", "vectors"], {"version": 7, "manifest_path": "..."}),
    ])

Every part applies, or none does: `commit` returns one result per part, in order (Iceberg: its
`metadata-location`; Delta: `{}`; Lance: the version), or raises `CommitRefused` naming the part that was refused
and why, with nothing applied. It uses only the standard library, so a pipeline can call it without this
package's dependencies.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from .keys import new_key

COMMIT_PATH = "/api/coordinator/v1/commit"


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
        raw = exc.read()
        try:
            error = json.loads(raw).get("error") or {}
        except ValueError:
            error = {"message": raw.decode(errors="replace")[:500]}
        raise CommitRefused(exc.code, error) from None
