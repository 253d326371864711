"""Opaque page tokens shared by every protocol's list routes: the last key returned, URL-safe base64."""

from __future__ import annotations

import base64

from .errors import BadRequest


def encode_page_token(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode()


def decode_page_token(token: str | None, param: str = "page_token") -> str | None:
    if not token:
        return None
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except Exception:
        raise BadRequest(f"invalid {param}: {token!r}") from None
