"""Storage credentials the service may hand to an engine (Iceberg's `/credentials`, UC's temporary credentials).

It holds one kind: the static S3 keys configured for its own warehouse. They reach the whole warehouse, so they
are vended only while authentication is off: with grants in force, a reader of one table could otherwise write or
delete every other, and clients bring their own credentials. Each protocol words the answer its own way.
"""

from __future__ import annotations

from typing import Mapping

from storage.files import is_within

from .config import Config


def vendable_s3_keys(config: Config, authenticating: bool, location: str) -> Mapping[str, str] | None:
    """The static S3 settings (`access_key_id`, `secret_access_key`, and `session_token`, `endpoint`, `region`
    where configured) for an s3:// `location` within the warehouse, or None when none may be vended."""
    if authenticating or not location.startswith(("s3://", "s3a://")):
        return None
    if "access_key_id" not in config.s3_options or not is_within(config.warehouse_uri, location):
        return None
    return config.s3_options
