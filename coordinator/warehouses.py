"""Named warehouses: a storage root (`file://...` or `s3://bucket/prefix`) and that storage's settings.

The service's own root (`--warehouse`) is the warehouse named `default`; others are created over the REST API
(api/warehouses.py) and kept in the database (storage/warehouses.py). Iceberg's catalog prefix named after a
warehouse places its tables in that warehouse's root, a Lance top-level namespace with the property
`warehouse=W` places its tables in W's root, and every file within a root is read and written with its settings.

Settings (`storage`), all optional:
- `endpoint`: the S3 API's URL (another S3-compatible server than AWS); `region`;
- `path_style`: address buckets as `endpoint/bucket` (true, most S3-compatible servers) or as `bucket.endpoint`;
- `credentials`: where the service's S3 credentials come from: `environment` (AWS_* variables, the default),
  `profile` (the named `profile` of the AWS config files), or `keys` (`access_key_id`, `secret_access_key` and
  optionally `session_token`, given here; never shown again in answers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from storage import warehouses as rows
from storage.files import FileIO, is_within, location_key
from storage.interface import Store
from storage.records import WarehouseUse

from .config import Config

from .errors import AlreadyExists, BadRequest, NotEmpty, NotFound

DEFAULT = "default"
SECRETS = ("secret_access_key", "session_token")
NAME_MAX = 64
# A warehouse's name is its Iceberg catalog prefix: these would make `/v1/{prefix}/...` another protocol's route.
RESERVED_NAMES = {"namespace", "table", "transaction", "config", "oauth"}


class NoSuchWarehouse(NotFound):
    pass


class WarehouseExists(AlreadyExists):
    pass


class WarehouseNotEmpty(NotEmpty):
    pass


def how_to_create(name: str) -> str:
    return (f"create it first: POST /api/coordinator/v1/warehouses {{\"name\": \"{name}\", \"location\": "
            f"\"s3://bucket/prefix or file:///path\"}} (or `coordinator warehouse create {name} LOCATION`)")


class StorageSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    credentials: Literal["environment", "profile", "keys"] = "environment"
    profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None

    def check(self) -> None:
        if self.credentials == "profile" and not self.profile:
            raise BadRequest('storage.credentials "profile" needs storage.profile, the AWS profile\'s name')
        has_keys = self.access_key_id is not None or self.secret_access_key is not None
        if self.credentials == "keys" and not (self.access_key_id and self.secret_access_key):
            raise BadRequest('storage.credentials "keys" needs storage.access_key_id and storage.secret_access_key')
        if self.credentials != "keys" and (has_keys or self.session_token is not None):
            raise BadRequest('keys are given only with storage.credentials "keys"')
        if self.credentials != "profile" and self.profile is not None:
            raise BadRequest('storage.profile is given only with storage.credentials "profile"')


@dataclass(frozen=True)
class Warehouse:
    name: str
    location: str
    storage: dict[str, Any] = field(default_factory=dict)

    def public(self) -> dict[str, Any]:
        """The warehouse as answered: secret keys are never shown (only that they are set)."""
        shown = {k: ("********" if k in SECRETS else v) for k, v in self.storage.items()}
        return {"name": self.name, "location": self.location, "storage": shown}

    def s3_options(self) -> dict[str, Any]:
        """obstore's S3Store options for files within this warehouse."""
        s = self.storage
        options: dict[str, Any] = {k: s[k] for k in ("endpoint", "region", "access_key_id", "secret_access_key",
                                                       "session_token") if s.get(k)}
        if s.get("path_style") is not None:
            options["virtual_hosted_style_request"] = "false" if s["path_style"] else "true"
        if str(s.get("endpoint", "")).startswith("http://"):
            options["allow_http"] = "true"   # (obstore refuses plain HTTP unless told)
        if s.get("credentials") == "profile":
            import boto3
            from obstore.auth.boto3 import Boto3CredentialProvider
            options["credential_provider"] = Boto3CredentialProvider(boto3.Session(profile_name=s["profile"]))
            options.setdefault("region", boto3.Session(profile_name=s["profile"]).region_name)
        return options


def normalize_location(location: Any) -> str:
    if not isinstance(location, str) or not location:
        raise BadRequest("location must be a storage root: file:///path or s3://bucket/prefix")
    location = location.rstrip("/")
    scheme = location.split("://", 1)[0] if "://" in location else ""
    if scheme not in ("file", "s3", "s3a"):
        raise BadRequest(f"location {location!r} must be a file:///path or s3://bucket/prefix URI")
    if scheme == "file" and not location.startswith("file:///"):
        raise BadRequest(f"location {location!r} must be an absolute file:/// URI")
    if scheme != "file" and not location.split("://", 1)[1].split("/", 1)[0]:
        raise BadRequest(f"location {location!r} names no bucket")
    if any(part in (".", "..") for part in location.split("://", 1)[1].split("/")):
        raise BadRequest(f"location {location!r} may not hold '.' or '..' segments")
    return location


class Warehouses:
    """The warehouses this service knows, kept in memory: placing a table asks on every create, and answering
    from memory costs nothing. In a cluster other members create and drop warehouses too, so a name is looked up
    in the database (`resolve`) before a request under it is served."""

    def __init__(self, config: Config, store: Store, files: FileIO, uses: list[WarehouseUse]):
        """`uses`: what the formats served place in a warehouse (their `Format.warehouses`)."""
        self.config, self.store, self.files, self.uses = config, store, files, uses
        self.default = Warehouse(DEFAULT, config.warehouse_uri.rstrip("/"),
                                 {k: v for k, v in config.s3_options.items()})
        self._named: dict[str, Warehouse] = {}

    async def load(self) -> None:
        self._set({name: Warehouse(name, location, storage)
                   for name, location, storage in await rows.list_warehouses(self.store)})

    def _set(self, named: dict[str, Warehouse]) -> None:
        self._named = named
        self.files.set_roots({w.location: w.s3_options() for w in named.values()})

    def named(self, name: str) -> Warehouse | None:
        """The named (non-default) warehouse `name` as last known in memory."""
        return self._named.get(name)

    async def resolve(self, name: str) -> Warehouse | None:
        """`name` as the database has it now (in a cluster; alone, memory is the database's copy)."""
        if not self.config.cluster:
            return self._named.get(name)
        row = await rows.get_warehouse(self.store, name)
        known = self._named.get(name)
        fresh = Warehouse(*row) if row is not None else None
        if fresh != known:
            named = dict(self._named)
            if fresh is None:
                named.pop(name, None)
            else:
                named[name] = fresh
            self._set(named)
        return fresh

    async def find(self, name_or_location: str) -> Warehouse:
        """A warehouse by its name or exactly its location (Iceberg's `warehouse` setting), else NoSuchWarehouse."""
        if name_or_location == DEFAULT:
            return self.default
        if self.config.cluster:
            await self.load()
        if name_or_location in self._named:
            return self._named[name_or_location]
        wanted = location_key(name_or_location.rstrip("/")) if "://" in name_or_location else None
        if "://" not in name_or_location and name_or_location.startswith("/"):
            from pathlib import Path
            wanted = location_key(Path(name_or_location).as_uri().rstrip("/"))
        for w in (self.default, *self._named.values()):
            if wanted is not None and location_key(w.location) == wanted:
                return w
        raise NoSuchWarehouse(f"no warehouse is named or located at {name_or_location!r}; "
                              f"{how_to_create(name_or_location if '/' not in name_or_location else 'NAME')}")

    def root(self, catalog: str) -> str | None:
        """The root of the warehouse named `catalog` (an Iceberg prefix, a Lance warehouse property), if any."""
        w = self._named.get(catalog) if catalog else None
        return w.location if w is not None else None

    def containing(self, location: str) -> Warehouse | None:
        """The warehouse whose root `location` lies within (the deepest one)."""
        found = [w for w in (*self._named.values(), self.default) if is_within(w.location, location)]
        return max(found, key=lambda w: len(w.location)) if found else None

    def all(self) -> list[Warehouse]:
        return [self.default, *sorted(self._named.values(), key=lambda w: w.name)]

    async def get(self, name: str) -> Warehouse:
        w = self.default if name == DEFAULT else await self.resolve(name)
        if w is None:
            raise NoSuchWarehouse(f"warehouse {name!r} does not exist; {how_to_create(name)}")
        return w

    async def create(self, body: Any) -> Warehouse:
        if not isinstance(body, dict):
            raise BadRequest('the body must be {"name", "location", "storage": {...}}')
        unknown = set(body) - {"name", "location", "storage"}
        if unknown:
            raise BadRequest(f"unknown fields {sorted(unknown)}: a warehouse has name, location and storage")
        name = body.get("name")
        if not isinstance(name, str) or not name or len(name) > NAME_MAX or not all(
                ch.isalnum() or ch in "-_." for ch in name) or name in (".", ".."):
            raise BadRequest(f"name must be 1 to {NAME_MAX} letters, digits, '-', '_' or '.', got {name!r}")
        location = normalize_location(body.get("location"))
        try:
            settings = StorageSettings.model_validate(body.get("storage") or {})
        except ValidationError as exc:
            problems = "; ".join(f"storage.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise BadRequest(f"invalid storage settings: {problems}") from None
        settings.check()
        if location.startswith("file://") and settings.model_dump(exclude_defaults=True):
            raise BadRequest("storage settings apply to s3:// locations only")
        if name == DEFAULT:
            raise WarehouseExists(f"warehouse {DEFAULT!r} is the service's own root ({self.default.location})")
        if name in RESERVED_NAMES:
            raise BadRequest(f"name {name!r} is reserved: /v1/{name}/... is another route; choose another name")
        for use in self.uses:
            if use.catalog and await self.store.list_namespaces(use.realm, name, None, limit=1):
                raise WarehouseExists(f"{name!r} is already {use.called} with namespaces in the default warehouse; "
                                      f"choose another name")
        await self.load()
        for other in (self.default, *self._named.values()):
            if is_within(other.location, location) or is_within(location, other.location):
                raise BadRequest(f"location {location} overlaps warehouse {other.name!r} at {other.location}: "
                                 f"each warehouse needs a root of its own")
        if await self.store.location_taken(location, below=True):
            raise BadRequest(f"location {location} is at, above or within an existing table's location")
        storage = settings.model_dump(exclude_none=True, exclude_defaults=False)
        warehouse = Warehouse(name, location, storage)
        try:
            warehouse.s3_options()   # a profile that does not exist is refused now, not at the first write
        except Exception as exc:
            raise BadRequest(f"the storage settings cannot be used: {exc}") from None
        if not await rows.insert_warehouse(self.store, name, location, storage):
            raise WarehouseExists(f"warehouse {name!r} already exists, or another warehouse has location {location}")
        self._set({**self._named, name: warehouse})
        return warehouse

    async def drop(self, name: str) -> None:
        if name == DEFAULT:
            raise BadRequest(f"warehouse {DEFAULT!r} is the service's own root and cannot be dropped")
        w = await self.get(name)
        if await rows.holds_anything(self.store, name, w.location, self.uses):
            raise WarehouseNotEmpty(f"warehouse {name!r} still holds namespaces or tables; drop them first")
        if not await rows.delete_warehouse(self.store, name):
            raise NoSuchWarehouse(f"warehouse {name!r} does not exist")
        self._set({k: v for k, v in self._named.items() if k != name})
