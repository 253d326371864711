"""Access control for every route, in one place.

Each view declares what it needs next to its route: `@guard(policy)`, where `policy(**view_args)` returns the
(privilege, securable) pairs the request needs (it may read the body), or `@public`. `enforce()` runs before
every request: it authenticates the caller and checks the policy. A routed view that declares nothing is
refused (fail closed), and tests/test_auth.py walks the route table to prove every route declares a policy.

401 (no or bad credential) and 403 (authenticated, lacks a privilege) are raised as Unauthorized/Forbidden, and
each protocol writes them in its own error format; every 401 also carries the RFC 6750 challenge (`challenge`).
"""

from __future__ import annotations

import inspect
from typing import Any, Awaitable, Callable, Union

from quart import current_app, g, request

from coordinator.auth import CALLER, Privilege, Resource
from coordinator.errors import Forbidden, InvalidClient, Unauthorized

from .context import current_coordinator

Needs = list[tuple[Privilege, Resource]]
Policy = Callable[..., Union[Needs, Awaitable[Needs]]]

READ, WRITE, CREATE, DROP = Privilege.READ, Privilege.WRITE, Privilege.CREATE, Privilege.DROP

PUBLIC: Policy = lambda **_: []  # noqa: E731
POLICIES: dict[Callable[..., Any], Policy] = {}


def guard(policy: Policy):
    """Declare what a view needs. Put it directly above the view function (under the route decorators)."""
    def wrap(fn):
        POLICIES[fn] = policy
        return fn
    return wrap


def public(fn):
    """No credential needed: health checks, documents, the token endpoint itself."""
    POLICIES[fn] = PUBLIC
    return fn


def authenticated(**_: Any) -> Needs:
    """Any authenticated caller (e.g. Iceberg's /v1/config)."""
    return []


def listing(policy: Policy) -> Policy:
    """A listing's policy, from the policy that names its container: the caller may list a container it may read,
    or one it holds any grant within; it then sees only the entries `visible` lets through, as Polaris and Unity
    Catalog list (a client granted namespaces `a` and `b` lists the root and sees those two)."""
    def needs(**args: Any) -> Needs:
        principal = getattr(g, "principal", None)
        wanted = policy(**args)
        return wanted if principal is None else [(p, r) for p, r in wanted if not principal.may_see(r)]
    return needs


def visible(resource: Resource) -> bool:
    """Whether the caller's listings show `resource` (everything, with authentication off)."""
    principal = getattr(g, "principal", None)
    return principal is None or principal.may_see(resource)


def readable(resource: Resource) -> bool:
    """Whether the caller may read `resource` (everything, with authentication off): a listing shows what it may
    see but not read (a table it may only write) by name only."""
    principal = getattr(g, "principal", None)
    return principal is None or principal.may(READ, resource)


def _credential(req, key_header: str | None) -> str | None:
    auth = req.headers.get("Authorization")
    if auth is not None:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("Authorization must use the Bearer scheme: 'Authorization: Bearer <token>'")
        return token.strip()
    if key_header is not None:
        return req.headers.get(key_header) or None  # the protocol's own identity header (Lance's spec)
    return None


async def enforce() -> None:
    # Runs for every request: quart's context proxies are resolved once (each proxied access is a lookup).
    req, app = request._get_current_object(), current_app._get_current_object()
    endpoint = req.endpoint
    view = app.view_functions.get(endpoint) if endpoint else None
    policy = POLICIES.get(view) if view is not None else None
    if view is not None and policy is None:
        raise Forbidden(f"route {endpoint} declares no access policy, so it is refused")
    if policy is PUBLIC:
        return
    authority = current_coordinator().authority
    if authority is None:  # no auth configured (loopback only): everyone is anonymous and allowed, whatever
        return             # credential a client sends along
    principal = g.principal = caller(authority, req, app.protocols.key_header(req.path))
    if policy is None:  # no route matched: the caller is known, and will get the protocol's 404
        return
    if inspect.iscoroutinefunction(policy):   # it may read the body: not for a caller that may do nothing
        refuse_if_nothing_granted(principal)
    needs = policy(**(req.view_args or {}))
    if inspect.isawaitable(needs):
        needs = await needs
    authority.check(principal, needs)


def refuse_if_nothing_granted(principal) -> None:
    """Forbidden if `principal` holds no grant at all: whatever a request names, it needs a privilege the caller
    lacks, so its body is not parsed to find out which (parsing costs the service's one event loop, which a
    client granted nothing could keep busy)."""
    if not principal.grants:
        raise Forbidden(f"{principal.name} holds no grant")


async def before_refusal(authority, exc: Exception, principal) -> None:
    """Before `exc` is answered (by Quart's error handler or a direct route): a 403 to a caller that holds no grant
    at all waits its turn (`Authority.hold_refusal`), so that a flood of them is answered a few a second."""
    if isinstance(exc, Forbidden) and principal is not None:
        await authority.hold_refusal(principal)


def caller(authority, req, key_header: str | None):
    """The principal `req`'s credential names (it becomes the CALLER); Unauthorized if it names none.
    `key_header`: the header besides Authorization that the path's protocol takes a token in, if any."""
    credential = _credential(req, key_header)
    if credential is None:
        raise Unauthorized("authentication required: send 'Authorization: Bearer <token>' (tokens come from "
                           "POST /v1/oauth/tokens with grant_type=client_credentials)")
    principal = authority.principal(credential)
    CALLER.set(principal.name)
    return principal


def challenge(exc: Exception, req, key_header: str | None) -> str | None:
    """RFC 6750's WWW-Authenticate for a 401: `Bearer`, and `error="invalid_token"` when a credential was sent
    and refused. None for errors that are not a bearer token's (a wrong client secret at the token endpoint)."""
    if not isinstance(exc, Unauthorized) or isinstance(exc, InvalidClient):
        return None
    sent = "Authorization" in req.headers or (key_header is not None and key_header in req.headers)
    return 'Bearer realm="coordinator", error="invalid_token"' if sent else 'Bearer realm="coordinator"'
