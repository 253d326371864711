"""Opaque page tokens shared by every protocol's list routes: the last key returned, URL-safe base64."""

from __future__ import annotations

import base64
import binascii
from typing import Any, Callable

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


def one_more(limit: int | None) -> int | None:
    """What to ask the store for: one row past the page, which tells whether a next page exists."""
    return None if limit is None else limit + 1


def page(rows: list, limit: int | None, cursor: Callable[[Any], str] = str) -> tuple[list, str | None]:
    """At most `limit` of `rows` (fetched with `one_more`), and the next page's token only if one follows: a
    last page never sends the client to an empty one. `cursor(row)` is the position the next page starts after."""
    if limit is None or len(rows) <= limit:
        return rows, None
    return rows[:limit], encode_page_token(cursor(rows[limit - 1]))
