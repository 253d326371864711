"""Opaque page tokens shared by every protocol's list routes: the last key returned, URL-safe base64."""

from __future__ import annotations

import base64
import binascii

from .errors import BadRequest


def encode_page_token(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode()


def decode_page_token(token: str | None, param: str = "page_token") -> str | None:
    """The key a token stands for. Strict, since every token we hand out is well-formed: a garbled one (characters
    outside the alphabet, which lenient base64 drops) would otherwise silently restart the listing, and a NUL, which
    no stored name holds, would reach PostgreSQL and fail there as an internal error."""
    if not token:
        return None
    try:
        value = base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise BadRequest(f"invalid {param}: {token!r}: pass back the token a listing returned") from None
    if "\x00" in value:
        raise BadRequest(f"invalid {param}: {token!r}: pass back the token a listing returned")
    return value
