"""The web console at /ui/: server-rendered pages over coordinator/console.py, read-only.

With authentication on, a page needs a token: the login form takes a client id and secret (exchanged for a token
as the token endpoint would) or a token, kept in an HttpOnly, SameSite=Strict cookie (and Secure when clients come
over HTTPS: `tls_proxy`); pages then show only the tables that token's client may read, and the warehouses it
uses. The form is taken only from the console's own origin (its `Origin`, else its `Referer`), so another site
cannot sign a browser in as a client of its choosing. The pages' routes are public to the access check (a browser
sends no Authorization header) and check the cookie themselves.
"""

from __future__ import annotations

from typing import Callable
from urllib.parse import urlsplit
from uuid import UUID

from quart import Blueprint, Response, redirect, render_template, request

from coordinator import console
from coordinator.auth import Principal, Privilege, Resource
from coordinator.errors import TooManyRequests, Unauthorized, Unavailable

from .access import public
from .common import json_response
from .context import current_coordinator
from .oauth import source_address

bp = Blueprint("console", __name__, url_prefix="/ui", template_folder="templates")

COOKIE = "coordinator_console_token"
HISTORY_PAGE = 20


def _caller() -> tuple[Principal | None, bool]:
    """(the cookie's principal, whether the caller may look): with authentication off, everyone may."""
    authority = current_coordinator().authority
    if authority is None:
        return None, True
    token = request.cookies.get(COOKIE)
    if not token:
        return None, False
    try:
        return authority.principal(token), True
    except Unauthorized:
        return None, False


def _may_read(principal: Principal | None) -> Callable[[Resource], bool]:
    if principal is None:
        return lambda _: True
    return lambda resource: principal.may(Privilege.READ, resource)


def _may_see(principal: Principal | None) -> Callable[[Resource], bool]:
    return (lambda _: True) if principal is None else principal.may_see


def _to_login() -> Response:
    return redirect("/ui/login")


async def _page(template: str, principal: Principal | None, **context) -> str:
    return await render_template(f"console/{template}", who=principal.name if principal else None,
                                 auth_on=current_coordinator().authority is not None, **context)


@bp.get("/")
@public
async def home():
    principal, allowed = _caller()
    if not allowed:
        return _to_login()
    coordinator = current_coordinator()
    catalogs = await console.catalogs(coordinator.store, coordinator.formats, _may_read(principal))
    warehouses = console.warehouses(coordinator.warehouses, coordinator.formats, _may_see(principal), catalogs)
    return await _page("home.html", principal, warehouses=warehouses, catalogs=catalogs)


@bp.get("/tables/<id>")
@public
async def table(id: str):  # noqa: A002  (`id`: the route parameter name every guarded-route test knows)
    table_id = id
    principal, allowed = _caller()
    if not allowed:
        return _to_login()
    coordinator = current_coordinator()
    store = coordinator.store
    try:
        uuid = UUID(table_id)
    except ValueError:
        uuid = None
    entry = await console.table(store, coordinator.formats, uuid, _may_read(principal)) if uuid is not None else None
    if entry is None:
        return await _page("missing.html", principal, table_id=table_id), 404
    before = request.args.get("before", type=int)
    commits, next_before = await console.history(store, entry.table_id, before=before, limit=HISTORY_PAGE)
    current = (await console.history(store, entry.table_id, before=None, limit=1))[0]
    return await _page("table.html", principal, table=entry, commits=commits, next_before=next_before,
                       current=current[0].version if current else None, paged=before is not None)


@bp.get("/stats")
@public
async def stats() -> Response:
    """Commit counts and latency sums per format, for the live panel (it computes rates between two polls)."""
    _, allowed = _caller()
    if not allowed:
        return _to_login()  # as every console page: the console's sign-in is its own, not a bearer token's
    return json_response(current_coordinator().metrics.snapshot())


@bp.route("/login", methods=["GET", "POST"])
@public
async def login():
    authority = current_coordinator().authority
    if authority is None:
        return redirect("/ui/")
    error = None
    if request.method == "POST":
        if not _from_own_origin():
            error = "the sign-in form must be sent from this console's own page: open /ui/login and sign in there"
            return await _page("login.html", None, error=error), 403
        form = await request.form
        token = (form.get("token") or "").strip()
        try:
            if not token:
                client_id, secret = form.get("client_id") or "", form.get("client_secret") or ""
                if not client_id or not secret:
                    raise Unauthorized("enter a client id and its secret, or a token")
                token = (await authority.client_credentials(client_id, secret, source_address())).access_token
            authority.principal(token)
        except (Unauthorized, TooManyRequests, Unavailable) as exc:
            error = exc.message
        else:
            response = redirect("/ui/")
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/ui",
                                secure=_scheme() == "https")
            return response
    return await _page("login.html", None, error=error)  # a refused sign-in shows the form again, saying why


def _scheme() -> str:
    """How clients reach the service: https behind a TLS-ending proxy (`tls_proxy`), else as this request came."""
    return "https" if current_coordinator().config.tls_proxy else request.scheme


def _from_own_origin() -> bool:
    """Whether the form was sent by a page of this console (login CSRF): the browser's `Origin`, or, from one that
    sends none, the `Referer`, names this service as the request reached it (scheme and Host)."""
    sent = request.headers.get("Origin") or request.headers.get("Referer")
    if not sent:
        return False
    origin = urlsplit(sent)
    return f"{origin.scheme}://{origin.netloc}" == f"{_scheme()}://{request.host}"


@bp.get("/logout")
@public
async def logout():
    response = redirect("/ui/login")
    response.delete_cookie(COOKIE, path="/ui")
    return response
