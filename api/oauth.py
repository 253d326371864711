"""`POST /v1/oauth/tokens`: the service's own OAuth2 token endpoint (Iceberg REST spec, RFC 6749 / 8693).

Grants:
- `client_credentials`: `client_id` and `client_secret` in the form (as pyiceberg and Iceberg's Java client send
  them) or in HTTP Basic auth;
- token exchange (`urn:ietf:params:oauth:grant-type:token-exchange`): a still-valid token for a fresh one, which
  is how Iceberg's Java client refreshes before expiry, until `token_exchange_max_s` after the client last proved
  its secret; sent with the client's credentials in HTTP Basic (how that client refreshes a token that has
  expired), the client proves its secret again and the subject token may have expired.
Errors use OAuth's own format: `{"error": ..., "error_description": ...}`; a request the throttle refuses (too many
tokens for its client, too many failed checks from its address or for its id) hears 429, and one that finds no
room among the checks waiting, 503 (`temporarily_unavailable`, Retry-After): coordinator/auth.py Throttle.
"""

from __future__ import annotations

import base64
import binascii
from urllib.parse import unquote_plus

from quart import Blueprint, Response, request

from coordinator.errors import CoordinatorError, TooManyRequests, Unauthorized, Unavailable

from .access import public
from .common import json_response
from .context import current_coordinator

bp = Blueprint("oauth", __name__)

CLIENT_CREDENTIALS = "client_credentials"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"


def oauth_error(status: int, error: str, description: str) -> Response:
    return json_response({"error": error, "error_description": description}, status,
                         {"Cache-Control": "no-store"})


def source_address() -> str | None:
    """The address a request came from, which failed secret checks are counted by (coordinator/auth.py Throttle):
    the connection's peer, or behind a TLS-ending proxy (`tls_proxy`) the last address of X-Forwarded-For, the one
    the proxy says connected to it (any before it are the client's own word)."""
    if current_coordinator().config.tls_proxy:
        forwarded = request.headers.get("X-Forwarded-For", "").rpartition(",")[2].strip()
        if forwarded:
            return forwarded
    return request.remote_addr


def _basic_credentials() -> tuple[str, str] | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        client_id, sep, secret = base64.b64decode(value, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    return (unquote_plus(client_id), unquote_plus(secret)) if sep else None


@bp.post("/v1/oauth/tokens")
@bp.post("/api/2.1/unity-catalog/iceberg/v1/oauth/tokens")   # where clients of that mount ask (api/iceberg/uniform.py)
@public
async def tokens() -> Response:
    authority = current_coordinator().authority
    if authority is None:
        return oauth_error(400, "invalid_request", "this server has no authentication configured: connect "
                                                   "without credentials")
    form = await request.form
    grant = form.get("grant_type")
    try:
        if grant == CLIENT_CREDENTIALS:
            client_id, secret = form.get("client_id"), form.get("client_secret")
            if client_id is None or secret is None:
                client_id, secret = _basic_credentials() or (None, None)
            if client_id is None or secret is None:
                return oauth_error(400, "invalid_request", "client_id and client_secret are required")
            token = await authority.client_credentials(client_id, secret, source_address())
        elif grant == TOKEN_EXCHANGE:
            subject = form.get("subject_token")
            if not subject:
                return oauth_error(400, "invalid_request", "subject_token is required")
            basic = _basic_credentials()
            token = (await authority.reauthenticate(subject, *basic, source_address()) if basic is not None
                     else authority.exchange(subject))
        else:
            return oauth_error(400, "unsupported_grant_type",
                               f"grant_type must be {CLIENT_CREDENTIALS} or {TOKEN_EXCHANGE}, got {grant!r}")
    except Unauthorized as exc:
        return oauth_error(401, "invalid_client", exc.message)
    except (TooManyRequests, Unavailable) as exc:
        response = oauth_error(exc.status, "temporarily_unavailable", exc.message)
        response.headers["Retry-After"] = str(exc.retry_after_s)
        return response
    except CoordinatorError as exc:
        return oauth_error(exc.status, "invalid_request", exc.message)
    return json_response({"access_token": token.access_token, "token_type": "bearer",
                          "expires_in": token.expires_in, "issued_token_type": ACCESS_TOKEN_TYPE},
                         headers={"Cache-Control": "no-store"})
