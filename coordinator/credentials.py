"""Storage credentials the service may hand to an engine (Iceberg's `/credentials`, UC's temporary credentials).

It holds one kind: the static S3 keys its own warehouse is reached with, given in `Config.s3_options` or, as
obstore takes them, in the environment's AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN). They
reach the whole warehouse, so they are vended only while authentication is off: with grants in force, a reader of
one table could otherwise write or delete every other, and clients bring their own credentials. Each protocol
words the answer its own way.
"""

from __future__ import annotations

import os
from typing import Mapping

from storage.files import is_within

from .config import Config

# How long an engine may cache vended keys (UC's `expiration_time`). Static keys do not expire; engines ask again
# after this, and so see keys the operator has rotated.
VENDED_KEYS_TTL_S = 3600

_ENV_KEYS = (("access_key_id", "AWS_ACCESS_KEY_ID"), ("secret_access_key", "AWS_SECRET_ACCESS_KEY"),
             ("session_token", "AWS_SESSION_TOKEN"))


def vendable_s3_keys(config: Config, authenticating: bool, location: str,
                     env: Mapping[str, str] | None = None) -> Mapping[str, str] | None:
    """The static S3 settings (`access_key_id`, `secret_access_key`, and `session_token`, `endpoint`, `region`
    where configured) for an s3:// `location` within the warehouse, or None when none may be vended."""
    if authenticating or not location.startswith(("s3://", "s3a://")):
        return None
    if not is_within(config.warehouse_uri, location):
        return None
    if "access_key_id" in config.s3_options:
        return config.s3_options
    env = os.environ if env is None else env
    keys = {ours: env[theirs] for ours, theirs in _ENV_KEYS if env.get(theirs)}
    if "access_key_id" not in keys or "secret_access_key" not in keys:
        return None
    return {**config.s3_options, **keys}
