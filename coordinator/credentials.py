"""Storage credentials the service may hand to an engine (Iceberg's `/credentials`, UC's temporary credentials).

It holds one kind: the static S3 keys the warehouse a table lies in is reached with: keys given for it (for the
default warehouse in `Config.s3_options`, for a named one in its settings) or, for a warehouse whose credentials
come from the environment, as obstore takes them, the environment's AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
(/ AWS_SESSION_TOKEN). They reach the whole warehouse, so they are vended only while authentication is off: with
grants in force, a reader of one table could otherwise write or delete every other, and clients bring their own
credentials. Each protocol words the answer its own way.
"""

from __future__ import annotations

import os
from typing import Mapping

from .warehouses import Warehouses

VENDED = ("access_key_id", "secret_access_key", "session_token", "endpoint", "region")

# How long an engine may cache vended keys (UC's `expiration_time`). Static keys do not expire; engines ask again
# after this, and so see keys the operator has rotated.
VENDED_KEYS_TTL_S = 3600

_ENV_KEYS = (("access_key_id", "AWS_ACCESS_KEY_ID"), ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
             ("session_token", "AWS_SESSION_TOKEN"))


def vendable_s3_keys(warehouses: Warehouses, authenticating: bool, location: str,
                     env: Mapping[str, str] | None = None) -> Mapping[str, str] | None:
    """The static S3 settings (`access_key_id`, `secret_access_key`, and `session_token`, `endpoint`, `region`
    where configured) of the warehouse an s3:// `location` lies in, or None when none may be vended."""
    if authenticating or not location.startswith(("s3://", "s3a://")):
        return None
    warehouse = warehouses.containing(location)
    if warehouse is None:
        return None
    settings = {k: warehouse.storage[k] for k in VENDED if warehouse.storage.get(k)}
    if "access_key_id" in settings:
        return settings
    if warehouse.storage.get("credentials", "environment") != "environment":
        return None   # a profile's credentials are the service's to use, not static keys to hand out
    env = os.environ if env is None else env
    keys = {ours: env[theirs] for ours, theirs in _ENV_KEYS if env.get(theirs)}
    if "access_key_id" not in keys or "secret_access_key" not in keys:
        return None
    return {**settings, **keys}
