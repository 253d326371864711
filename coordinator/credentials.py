"""Storage credentials the service may hand to an engine (Iceberg's `/credentials`, UC's temporary credentials).

It holds one kind: the static S3 keys configured for a warehouse (the service's own, or one created with keys).
They reach the whole warehouse, so they
are vended only while authentication is off: with grants in force, a reader of one table could otherwise write or
delete every other, and clients bring their own credentials. Each protocol words the answer its own way.
"""

from __future__ import annotations

from typing import Mapping

from .warehouses import Warehouses

VENDED = ("access_key_id", "secret_access_key", "session_token", "endpoint", "region")


def vendable_s3_keys(warehouses: Warehouses, authenticating: bool, location: str) -> Mapping[str, str] | None:
    """The static S3 settings (`access_key_id`, `secret_access_key`, and `session_token`, `endpoint`, `region`
    where configured) of the warehouse an s3:// `location` lies in, or None when none may be vended."""
    if authenticating or not location.startswith(("s3://", "s3a://")):
        return None
    warehouse = warehouses.containing(location)
    if warehouse is None or "access_key_id" not in warehouse.storage:
        return None
    return {k: warehouse.storage[k] for k in VENDED if warehouse.storage.get(k)}
