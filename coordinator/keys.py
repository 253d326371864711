"""Idempotency-Keys as clients send them: UUIDv7 strings (RFC 9562). Standard library only, so that
coordinator/client.py stays importable without the service's dependencies."""

from __future__ import annotations

import os
import time
import uuid


def new_key() -> str:
    """A fresh key."""
    return str(uuid7())


def uuid7() -> uuid.UUID:
    """A fresh UUIDv7: time-ordered to the millisecond, then random. Python gains `uuid.uuid7` only in 3.14."""
    ms = int(time.time() * 1000)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 64) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return uuid.UUID(int=value)
