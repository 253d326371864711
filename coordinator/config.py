"""The service's one configuration object: typed defaults, units in the names, loaded from env or a mapping."""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

ENV_PREFIX = "COORDINATOR_"


class ConfigError(ValueError):
    """A configuration the service refuses to start with; the message says what to change."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 8181
    # None: run the embedded PostgreSQL in `data_dir` (no set-up needed).
    database_url: str | None = None
    data_dir: Path = Path(".coordinator")
    # Root under which new tables get their location (file:// path or s3:// URI). Default: <data_dir>/warehouse.
    warehouse: str | None = None
    log_level: str = "info"
    shutdown_grace_s: float = 5.0    # how long a stopping server lets in-flight requests finish
    # Slow clients (slowloris) cannot hold a connection: an idle connection is closed after `http_keep_alive_s`,
    # which is also the deadline for a request's line and headers (trickled bytes do not extend it), and a
    # request's whole body must arrive within `http_body_timeout_s` (408 otherwise).
    http_keep_alive_s: float = 75.0
    http_body_timeout_s: float = 60.0
    # Connections open at once, at most (0: as many as the process's descriptor limit leaves room for, beside the
    # database's, the files' and the cluster's, up to 10,000). Past it a new connection takes an idle one's place.
    http_max_connections: int = 0

    # Authentication: a TOML file of clients, roles and grants (see coordinator/auth.py). Without one every
    # request is anonymous and allowed, which is only safe on loopback: binding any other address without it
    # refuses to start unless `insecure` is set.
    auth_file: Path | None = None
    insecure: bool = False
    # The token endpoint and the console's sign-in check a client's secret (scrypt, ~50 ms of a core each, on
    # purpose; coordinator/auth.py Throttle): per client id at most `token_requests_burst` tokens at once and then
    # `token_requests_per_s` a second; per address at most `token_failures_burst` failed checks at once and then
    # `token_failures_per_s` a second, per client id five times that (429 beyond); and at most
    # `token_requests_queued` checks waiting for a core or running (503 beyond).
    token_requests_per_s: float = 10.0
    token_requests_burst: int = 20
    token_requests_queued: int = 32
    token_failures_per_s: float = 0.2
    token_failures_burst: int = 20
    # Clients reach the service over HTTPS through a proxy that ends TLS (the service itself speaks plain HTTP):
    # the console's sign-in cookie is then marked Secure, so a browser never sends it over plain HTTP.
    tls_proxy: bool = False

    # Table actors
    mailbox_size: int = 256          # requests queued per table before 503 + Retry-After
    actor_idle_s: float = 10.0       # an actor with no request for this long ends; its table goes dormant
    dormant_tables_max: int = 100_000  # idle tables kept compact in memory (least recently used beyond: reload)
    retry_after_s: int = 1           # advertised in Retry-After on 503

    # Iceberg: new tables get the property commit.rebase-appends.enabled=true (unless their creator sets it): the
    # table's actor rebases an append whose branch moved on instead of answering 409 (docs/rebasing.md).
    rebase_appends: bool = False

    # Delta (Unity Catalog)
    delta_max_unpublished_commits: int = 10   # a commit leaving more unpublished gets 429: clients must backfill
    # A Lance final manifest the namespace never recorded is removed once it is older than this: a younger one may
    # be a writer's own final name, handed in as manifest_path, whose version/create is still on its way.
    lance_unrecorded_grace_s: float = 60.0
    delta_commits_page_size: int = 100        # most commits one GET commits answer returns
    # Delta tables read as Iceberg (UniForm, coordinator/uniform): worker processes converting the tables whose
    # writers send no Iceberg metadata (0: none are converted), and how long the metadata files a conversion makes
    # obsolete (expired snapshots' manifests, old metadata files) are kept for readers still planning with them.
    uniform_workers: int = 1
    uniform_grace_s: float = 60.0
    # The largest Iceberg metadata file the service writes for a converted table or serves from a writer's
    # conversion (older snapshots expire early to stay below it; a table whose current schema alone is larger is
    # refused), and how many bytes of served metadata files are kept in memory, for all tables together.
    uniform_max_metadata_bytes: int = 8 << 20
    uniform_cache_bytes: int = 64 << 20

    # Table maintenance (coordinator/maintenance, docs/maintenance.md). Iceberg snapshot expiry runs on tables with
    # `maintenance.expire-snapshots.enabled=true`, or on every table without that property when this is on; at
    # most once per `maintenance_interval_s` per table, after a writer's commit leaves the table over its limits.
    # The files only expired snapshots referenced are deleted `maintenance_delete_grace_s` after the expiry, when
    # no reader can still be planning with them.
    maintenance_expire_snapshots: bool = False
    maintenance_interval_s: float = 10.0
    maintenance_delete_grace_s: float = 60.0
    # Delta: the service publishes each ratified commit to `_delta_log/<v>.json` itself (backfill), on tables with
    # `maintenance.publish-commits.enabled=true`, or on every catalog-managed table without it when this is on.
    maintenance_publish_delta: bool = False

    # Metrics reports (Iceberg's `POST .../tables/{table}/metrics`, Unity Catalog's `/delta/metrics`): kept for
    # observability, never read on the commit path, and bounded, since a client that may only read a table may
    # send them: a larger report is refused (400), a table keeps its newest `metrics_reports_per_table`, and a
    # report is deleted `metrics_report_retain_s` after it came.
    metrics_report_max_bytes: int = 64 * 1024
    metrics_reports_per_table: int = 100
    metrics_report_retain_s: float = 7 * 24 * 3600.0
    # The commit feed (GET /api/coordinator/v1/events, docs/events.md) keeps events this long and at most this
    # many, whichever deletes more. An event takes about 0.6 KB in the database: 1,000,000 are about 0.6 GB.
    events_retention_s: float = 7 * 24 * 3600.0
    events_max: int = 1_000_000
    # Readers waiting in a long-poll (`wait`): at most this many at once, and this many per client (one client id;
    # every reader is one client without authentication). Beyond, a long-poll is refused at once: 429 for the
    # client over its share, 503 when the service is full, both with Retry-After. The feed reads through a pool of
    # `feed_db_pool_size` connections of its own, never taking those that commits need.
    feed_waiters_max: int = 1000
    feed_waiters_per_client: int = 100
    feed_db_pool_size: int = 2

    # Storage
    db_pool_size: int = 4
    db_timeout_s: float = 10.0
    s3_options: dict[str, str] = field(default_factory=dict)  # passed to obstore's S3Store (region, endpoint, ...)
    # The usual S3 settings by name (env COORDINATOR_S3_ENDPOINT, ...), folded into `s3_options`. Credentials
    # are not among them: obstore reads the environment's AWS_* variables, as every AWS client does.
    s3_endpoint: str | None = None            # an S3-compatible server, e.g. http://127.0.0.1:9000
    s3_region: str | None = None
    s3_path_style: bool = False               # http://host/bucket/key instead of http://bucket.host/key

    # Scale-out (coordinator/cluster): several members on one database. Off by default: one process owns every
    # table with no leases. On with `cluster`, a `cluster_advertise` address, or `workers` > 1.
    cluster: bool = False
    workers: int = 1                          # `coordinator serve --workers N`: N member processes on one port
    http_fd: int | None = None                # serve HTTP on this inherited listening socket (set by --workers)
    cluster_host: str = "127.0.0.1"           # where this member's internal channel listens (a private interface)
    cluster_port: int = 0                     # 0: any free port
    cluster_advertise: str | None = None      # host:port peers dial to reach this member's channel
    # The channel's secret, the same file on every member (coordinator/cluster/secret.py). None: the data dir's
    # cluster.key, made on first use, which members on one host share; members reached at a non-loopback
    # address must be given one.
    cluster_secret_file: Path | None = None
    lease_ttl_s: float = 3.0                  # a dead member's shards are taken over about this long after it died
    lease_renew_s: float = 0.5                # leases are renewed (and expired ones looked for) this often
    lease_margin_s: float = 0.75              # stop serving this long before the lease could expire in the database
    # How long a request waits for a moving shard's next owner before a 503: past a crashed owner's takeover
    # (lease_ttl_s + 2 x lease_renew_s), and past a hand-over or a rebalance on a loaded machine, where a shard may
    # have no owner for a few lease passes (measured: over 2 s).
    cluster_route_wait_s: float = 5.0
    cluster_prepare_timeout_s: float = 10.0   # a held transaction part settles itself from the store after this
    # Speak at most this cluster channel version (the one before this release's, for tests of a rolling upgrade;
    # docs/cluster.md). None: this release's.
    cluster_channel_version: int | None = None

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir)
        self.port = int(self.port)
        if self.auth_file is not None:
            self.auth_file = Path(self.auth_file)
        if self.cluster_secret_file is not None:
            self.cluster_secret_file = Path(self.cluster_secret_file)
        if self.cluster_advertise or int(self.workers) > 1:
            self.cluster = True
        if self.cluster_channel_version is not None:
            self.cluster_channel_version = int(self.cluster_channel_version)
        self.s3_options = {**self.s3_options, **self._named_s3_options()}

    def _named_s3_options(self) -> dict[str, str]:
        """obstore's names for `s3_endpoint`, `s3_region` and `s3_path_style`."""
        options = {}
        if self.s3_endpoint:
            options["endpoint"] = self.s3_endpoint
            if self.s3_endpoint.startswith("http://"):
                options["allow_http"] = "true"   # (obstore refuses plain HTTP unless told)
        if self.s3_region:
            options["region"] = self.s3_region
        if self.s3_path_style:
            options["virtual_hosted_style_request"] = "false"
        return options

    def check_exposure(self) -> None:
        """Refuse to serve without authentication on an address other machines can reach."""
        if self.auth_file is None and not self.insecure and not is_loopback(self.host):
            raise ConfigError(f"refusing to listen on {self.host} without authentication: give --auth-file (clients, "
                             f"roles and grants), or --insecure to accept anonymous requests from the network")

    @property
    def warehouse_uri(self) -> str:
        return _warehouse_uri(self.warehouse, self.data_dir)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "Config":
        names = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if value is None or key not in names:
                continue
            kind = names[key].type
            if kind in ("int",):
                value = int(value)
            elif kind in ("float",):
                value = float(value)
            elif kind in ("bool",) and isinstance(value, str):
                value = value.strip().lower() in ("1", "true", "yes", "on")
            kwargs[key] = value
        return cls(**kwargs)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Config":
        """COORDINATOR_<FIELD> variables (e.g. COORDINATOR_DATABASE_URL), then explicit overrides on top."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {
            f.name: env[ENV_PREFIX + f.name.upper()]
            for f in dataclasses.fields(cls)
            if ENV_PREFIX + f.name.upper() in env and f.name != "s3_options"
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(values)


@functools.lru_cache(maxsize=64)
def _warehouse_uri(warehouse: str | None, data_dir: Path) -> str:
    # Cached: the commit path asks for it on every Iceberg commit, and resolve() walks the path with syscalls.
    if warehouse:
        return warehouse if "://" in warehouse else Path(warehouse).resolve().as_uri()
    return (Path(data_dir).resolve() / "warehouse").as_uri()
