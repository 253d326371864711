"""Who may do what: clients, roles and grants from the auth file; hashed secrets; signed bearer tokens.

Format-neutral. A securable is a path of names, outermost first. A container's path (a catalog, a namespace, a
schema) is its names; a table's (or view's) path is its container's path and then its name as a `Table`, never
equal to a container's name, so that a table and a namespace of the same dotted name (`sales.orders`) are two
securables, neither within the other:

    (format, catalog, *namespace levels, Table(name))    a format whose tables have a catalog
    (format, *namespace levels, Table(name))             one whose tables have none

Each format's `Grants` (its declaration, coordinator/format.py) says which it is and how deep its tables lie: Iceberg's catalog is
its prefix ("" for none), Unity Catalog's a catalog with one level of schemas, Lance has no catalog.

A grant on a container covers everything below it (privileges are inherited downward); a grant on a table covers
that table only. The auth file (TOML) names clients, their hashed secrets and roles, and what each role is
granted; a grant names a container (`on`) or a table (`table`), never both::

    token_ttl_s = 3600
    [[clients]]
    id = "etl"
    secret = "scrypt$16384$8$1$..."      # `coordinator hash-secret`
    roles = ["writer"]
    [roles.writer]
    grants = [{ on = "iceberg//sales", privileges = ["read", "write", "create"] },
              { table = "delta/main/default/orders", privileges = ["read"] }]

Paths are `/`-separated ("*" is everything); a segment may be percent-encoded (`%2F`).

Tokens name their client (`sub`) and the generation of its secret (`gen`, a digest of the stored hash), so
giving a client a new secret revokes every token it was issued; a token exchange keeps the time the client last
proved its secret (`auth_time`), and refuses to go on past `token_exchange_max_s` from then.
"""

from __future__ import annotations

import base64
import contextvars
import enum
import functools
import hashlib
import hmac
import secrets
import time
import tomllib
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import unquote

import jwt

from .config import ConfigError
from .errors import Forbidden, InvalidClient, TooManyRequests, Unauthorized, Unavailable
from .throttle import Throttle, source_key


@dataclass(frozen=True)
class Table:
    """The last segment of a table's (or an Iceberg view's) securable: unequal to any container's name."""
    name: str

    def __str__(self) -> str:
        return self.name


Resource = tuple[str | Table, ...]


@dataclass(frozen=True)
class Grants:
    """Where a format's tables sit in the paths that grants name (its `Format.grants`): a table's securable is the
    format's name, its catalog (if `catalog`), its namespace levels, and its name as a `Table`."""

    shape: str             # a table's path as the auth file spells it, e.g. "delta/<catalog>/<schema>/<name>"
    table_depth: int       # a table's path has at least this many segments, the format's name included ...
    exact: bool = False    # ... or exactly as many: then no container's path is that long
    catalog: bool = True   # its paths name the table's catalog after the format's name (Lance's have no catalog)


def table_securable(container: Resource, name: str) -> Resource:
    """The securable of table (or view) `name` in `container`."""
    return (*container, Table(name))


ISSUER = "commit-coordinator"
# Who sends the request being served (api/access.py sets it once a token is verified), for what records its maker:
# Unity Catalog's owner / created_by / updated_by. Without authentication everyone is anonymous.
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("caller", default="anonymous")
VERIFIED_TOKENS_MAX = 4096  # tokens remembered as verified (see Authority.principal)
NO_GRANT_REFUSAL_S = 0.1    # a client holding no grant is refused (403) at most ten times a second


class Privilege(str, enum.Enum):
    READ = "read"        # load, list, describe
    WRITE = "write"      # commit, update properties
    CREATE = "create"    # create children (namespaces, tables, views) in a container
    DROP = "drop"        # drop or rename away
    ADMIN = "admin"      # everything above


@dataclass(frozen=True)
class Grant:
    path: Resource
    privileges: frozenset[Privilege]

    def allows(self, privilege: Privilege, resource: Resource) -> bool:
        return (resource[:len(self.path)] == self.path
                and (privilege in self.privileges or Privilege.ADMIN in self.privileges))


@dataclass(frozen=True)
class Principal:
    name: str
    roles: tuple[str, ...] = ()
    grants: tuple[Grant, ...] = ()

    def may(self, privilege: Privilege, resource: Resource) -> bool:
        return any(g.allows(privilege, resource) for g in self.grants)

    def may_see(self, resource: Resource) -> bool:
        """Whether a listing shows `resource`: the caller may read it, or holds a grant on it or on something within
        it (so that it can find its way down to what it was granted)."""
        return self.may(Privilege.READ, resource) or any(g.path[:len(resource)] == resource for g in self.grants)


@dataclass(frozen=True)
class Client:
    id: str
    secret_hash: str
    principal: Principal


# -- secrets: scrypt (memory-hard, in the standard library through OpenSSL) ------------------------------------

_SCRYPT = (2**14, 8, 1)


def hash_secret(secret: str) -> str:
    n, r, p = _SCRYPT
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=n, r=r, p=p, dklen=32)
    return "$".join(["scrypt", str(n), str(r), str(p), base64.b64encode(salt).decode(),
                     base64.b64encode(digest).decode()])


def verify_secret(secret: str, stored: str) -> bool:
    """Constant-time check of `secret` against a `hash_secret` string. Slow on purpose (~50 ms): call it off
    the event loop."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(secret.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p),
                                dklen=len(expected), maxmem=256 * 1024 * 1024)
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


# -- the auth file -----------------------------------------------------------------------------------------------


def parse_path(on: str) -> Resource:
    if on == "*":
        return ()
    return tuple(unquote(s) for s in on.split("/"))


def parse_grant(spec: Any, formats: Mapping[str, Grants] | None) -> Resource:
    """The securable a grant of the auth file names: a container (`on`: a path, or "*") or a table (`table`), in
    one of `formats` (by name, where each format's tables sit)."""
    if not isinstance(spec, dict) or ("on" in spec) == ("table" in spec):
        raise ValueError("a grant names a container (`on`) or a table (`table`), one of the two")
    raw = spec.get("on", spec.get("table"))
    if not isinstance(raw, str) or not raw:
        raise ValueError("the path must be a non-empty string")
    path = parse_path(raw)
    known = formats or {}
    shape = known.get(path[0]) if path else None
    if path and shape is None:
        raise ValueError(f"a path starts with the format ({', '.join(known)}) or is \"*\", got {raw!r}")
    if "table" in spec:
        if shape is None or len(path) < shape.table_depth or (shape.exact and len(path) != shape.table_depth):
            raise ValueError(f"table {raw!r} names no table: tables are {', '.join(g.shape for g in known.values())}")
        return table_securable(path[:-1], path[-1])
    if shape is not None and shape.exact and len(path) >= shape.table_depth:
        raise ValueError(f"on = {raw!r} is where {path[0]}'s tables are ({shape.shape}), below every container: "
                         f"name a table with `table = {raw!r}`")
    return path


@dataclass
class AuthConfig:
    clients: dict[str, Client] = field(default_factory=dict)
    token_ttl_s: int = 3600
    # A token exchange (a client refreshing its token) is answered until this long after the client last proved
    # its secret; then the client proves it again (client_credentials), so a token taken once cannot be renewed
    # forever.
    token_exchange_max_s: int = 8 * 3600
    signing_key: bytes | None = None   # None: the service keeps one in its database (shared by all members)

    @classmethod
    def load(cls, path: str | Path, formats: Mapping[str, Grants] | None = None) -> "AuthConfig":
        """The auth file at `path`; its grants name tables of `formats` (each format's `Grants` by its name; none:
        only "*", and no table)."""
        try:
            raw = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"auth file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"auth file {path} is not valid TOML: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, not text
            raise ConfigError(f"cannot read auth file {path} ({exc.__class__.__name__}: "
                              f"{getattr(exc, 'strerror', None) or exc}); check the path and its permissions") from None
        return cls.from_mapping(raw, source=str(path), formats=formats)

    @classmethod
    def from_mapping(cls, raw: dict[str, Any], source: str = "auth config",
                     formats: Mapping[str, Grants] | None = None) -> "AuthConfig":
        roles: dict[str, tuple[Grant, ...]] = {}
        for role, spec in raw.get("roles", {}).items():
            grants = []
            for i, g in enumerate(spec.get("grants", [])):
                try:
                    privileges = frozenset(Privilege(p) for p in g["privileges"])
                    grants.append(Grant(parse_grant(g, formats), privileges))
                except (KeyError, ValueError, TypeError) as exc:
                    raise ConfigError(f"{source}: roles.{role}.grants[{i}] needs `on` (a container's path) or "
                                     f"`table` (a table's), and `privileges` (of "
                                     f"{', '.join(p.value for p in Privilege)}): {exc}") from None
            roles[role] = tuple(grants)
        clients = {}
        for i, c in enumerate(raw.get("clients", [])):
            if "id" not in c or "secret" not in c:
                raise ConfigError(f"{source}: clients[{i}] needs `id` and `secret` (a hash from "
                                 f"`coordinator hash-secret`)")
            if not str(c["secret"]).startswith("scrypt$"):
                raise ConfigError(f"{source}: clients[{i}] ({c['id']}): `secret` must be a hash from "
                                 f"`coordinator hash-secret`, never the secret itself")
            missing = [r for r in c.get("roles", []) if r not in roles]
            if missing:
                raise ConfigError(f"{source}: client {c['id']} has undefined roles {missing}")
            grants = tuple(g for r in c.get("roles", []) for g in roles[r])
            clients[c["id"]] = Client(c["id"], c["secret"], Principal(c["id"], tuple(c.get("roles", [])), grants))
        key = raw.get("signing_key")
        return cls(clients=clients, token_ttl_s=int(raw.get("token_ttl_s", cls.token_ttl_s)),
                   token_exchange_max_s=int(raw.get("token_exchange_max_s", cls.token_exchange_max_s)),
                   signing_key=key.encode() if key else None)


# -- tokens: signed JWTs (HS256 via PyJWT) -------------------------------------------------------------------------


@dataclass(frozen=True)
class Token:
    access_token: str
    expires_in: int


class Authority:
    """Issues tokens to clients that prove their secret, and turns a presented token into a Principal."""

    def __init__(self, config: AuthConfig, signing_key: bytes, throttle: Throttle):
        self.config = config
        self._key = signing_key
        self._throttle = throttle
        # The generation of each client's secret, which its tokens carry (`gen`): a new secret, a new generation,
        # and the tokens of the old one are refused. Keyed with the signing key, so a token tells nothing of the
        # stored hash.
        self._generations = {c.id: hmac.new(signing_key, c.secret_hash.encode(), "sha256").hexdigest()[:16]
                             for c in config.clients.values()}
        # token -> (principal, expiry): checking a token costs ~0.1 ms of CPU, and every request presents one.
        self._verified: dict[str, tuple[Principal, int]] = {}

    async def client_credentials(self, client_id: str, secret: str, source: str | None) -> Token:
        """A token for a client that proves its secret (the token endpoint's client_credentials, the console's
        sign-in) in a request from address `source`: throttled (TooManyRequests) and by how many checks wait
        (Unavailable), see Throttle; a refusal is held for an address that asks again too soon (Tarpit)."""
        client = self.config.clients.get(client_id)
        # Verify even for an unknown client so that timing does not tell which ids exist.
        stored = client.secret_hash if client else _dummy_hash()
        known, source = client.id if client else None, source_key(source)
        try:
            ok = await self._throttle.check(known, source, verify_secret, secret, stored)
        except (TooManyRequests, Unavailable) as refusal:   # answered no faster than it says to ask again
            await self._throttle.tarpit.hold((source, known), refusal.retry_after_s)
            raise
        if client is None or not ok:
            raise InvalidClient("invalid client id or secret")
        return self._issue(client.id, auth_time=int(time.time()))

    async def hold_refusal(self, principal: Principal) -> None:
        """Before a 403 to `principal`: one that holds no grant at all is refused whatever it asks, so it is no
        client doing work, and its refusals are answered at most one per NO_GRANT_REFUSAL_S, however many
        connections it asks on (Tarpit): a flood of them costs the service sleeping tasks, not answers."""
        if not principal.grants:
            await self._throttle.tarpit.hold(("no grant", principal.name), NO_GRANT_REFUSAL_S)

    def exchange(self, subject_token: str) -> Token:
        """RFC 8693 token exchange, how clients refresh: a fresh token for the same client, expiring no later than
        `token_exchange_max_s` after the client last proved its secret; past that, the client proves it again."""
        claims = self._claims(subject_token)
        auth_time = int(claims["auth_time"])
        until = auth_time + self.config.token_exchange_max_s
        if until <= time.time():
            raise Unauthorized(f"the session began more than token_exchange_max_s ({self.config.token_exchange_max_s}"
                               f" s) ago: authenticate with the client's secret (grant_type=client_credentials)")
        return self._issue(claims["sub"], auth_time=auth_time, until=until)

    async def reauthenticate(self, subject_token: str, client_id: str, secret: str, source: str | None) -> Token:
        """A token exchange sent with the client's own credentials (HTTP Basic), as Iceberg's Java client refreshes
        a token that has already expired: the subject token must be one this service issued to that client
        (expired or not), and the client proves its secret again."""
        claims = self._claims(subject_token, expired_too=True)
        if claims["sub"] != client_id:
            raise InvalidClient("the subject token was issued to another client")
        return await self.client_credentials(client_id, secret, source)

    def _issue(self, subject: str, *, auth_time: int, until: float | None = None) -> Token:
        now = int(time.time())
        expires = now + self.config.token_ttl_s if until is None else min(now + self.config.token_ttl_s, int(until))
        claims = {"iss": ISSUER, "sub": subject, "gen": self._generations[subject], "auth_time": auth_time,
                  "iat": now, "exp": expires, "jti": uuid.uuid4().hex}
        return Token(jwt.encode(claims, self._key, algorithm="HS256"), expires - now)

    def principal(self, token: str) -> Principal:
        """The token's principal. A token verified before is trusted until it expires: the signing key and the
        clients (their grants, the generations of their secrets) do not change while the service runs, so
        verifying it again would give the same answer."""
        known = self._verified.get(token)
        if known is not None and time.time() < known[1]:
            return known[0]
        claims = self._claims(token)
        principal, expires = self.config.clients[claims["sub"]].principal, int(claims["exp"])
        if len(self._verified) >= VERIFIED_TOKENS_MAX:
            del self._verified[next(iter(self._verified))]  # the oldest
        self._verified[token] = (principal, expires)
        return principal

    def _claims(self, token: str, *, expired_too: bool = False) -> dict[str, Any]:
        """The claims of a token this service issued to a client still configured, with its current secret."""
        try:
            claims = jwt.decode(token, self._key, algorithms=["HS256"], issuer=ISSUER,
                                options={"require": ["exp", "sub", "iss"], "verify_exp": not expired_too})
        except jwt.ExpiredSignatureError:
            raise Unauthorized("the token has expired: get a new one from /v1/oauth/tokens") from None
        except jwt.InvalidTokenError:
            raise Unauthorized("the bearer token is not one this service issued (or it was altered): get a token "
                               "from POST /v1/oauth/tokens with grant_type=client_credentials") from None
        if claims["sub"] not in self.config.clients:
            raise Unauthorized(f"client {claims['sub']!r} is no longer configured")
        if claims.get("gen") != self._generations[claims["sub"]]:
            raise Unauthorized("the token was revoked: its client was given a new secret since (or an older version "
                               "of this service issued it); get a new one from POST /v1/oauth/tokens")
        return claims

    @staticmethod
    def check(principal: Principal, needs: Iterable[tuple[Privilege, Resource]]) -> None:
        for privilege, resource in needs:
            if not principal.may(privilege, resource):
                raise Forbidden(f"{principal.name} lacks {privilege.value} on {format_path(resource)}")


def format_path(resource: Resource) -> str:
    """A securable as the auth file names it: `*`, a container's path, or `table <path>`."""
    path = "/".join(map(str, resource)) or "*"
    return f"table {path}" if resource and isinstance(resource[-1], Table) else path


def new_signing_key() -> bytes:
    return secrets.token_bytes(32)


@functools.cache
def _dummy_hash() -> str:
    return hash_secret(secrets.token_hex(8))
