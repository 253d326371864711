"""The coordinator as one object: its store, file IO, actor registry and the services of the formats it serves.

The HTTP layer (`api/`) holds one of these and calls the formats' services; tests and embedding programs may too.
Each format's service is built from the shared parts (`Services`) once they are all open, from what the format
declares (coordinator/format.py): the registry learns from the declaration how its rows load and its purge claims
list their files, never from the service.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Awaitable, Callable, TypeVar

import trio

from storage.embedded import EmbeddedPostgres
from storage.files import FileIO
from storage.errors import DatabaseUnreachable, StorageError
from storage.owner import DatabaseInUse
from storage.postgres import APPLICATION_NAME, PostgresStore

from .auth import AuthConfig, Authority, new_signing_key
from .throttle import Throttle
from .cluster import Cluster
from .config import Config, ConfigError
from .delta.format import DELTA
from .iceberg.format import ICEBERG
from .maintenance import Maintainer
from .errors import CoordinatorError
from .feed import PRUNE_EVERY_S, Feed
from .format import Format, Formats, Services
from .formats import FORMATS
from .idempotency import RETAIN_S, Idempotency
from .metrics import Metrics
from .registry import Registry
from .uniform import Converter, UniformCatalog
from .warehouses import Warehouses

log = logging.getLogger(__name__)

S = TypeVar("S")


class Coordinator:
    def __init__(self, config: Config, formats: Formats = FORMATS):
        self.config = config
        self.formats = formats
        self.metrics = Metrics(formats.names)
        self.embedded: EmbeddedPostgres | None = None
        self.store: PostgresStore | None = None
        self.files = FileIO(config.s3_options, config.warehouse_uri)
        self.metrics.add_counters(lambda: {"coordinator_file_write_cpu_seconds_total": self.files.write_cpu_s})
        self.files.on_write = self.metrics.file_write.observe
        self.auth: AuthConfig | None = None
        # Made by `open`: the shared parts (also as `services`, what every other part is built from), each format's
        # service by the format's name, UniForm (Delta tables read as Iceberg) and, with several members, the cluster.
        self.registry: Registry | None = None
        self.feed: Feed | None = None
        self.idempotency: Idempotency | None = None
        self.warehouses: Warehouses | None = None
        self.services: Services | None = None
        self._formats: dict[str, Any] = {}
        self.uniform: UniformCatalog | None = None   # Delta tables read as Iceberg (coordinator/uniform) ...
        self.converter: Converter | None = None      # ... and converted for the writers that send no Iceberg metadata
        self.maintainer: Maintainer | None = None    # the service's own maintenance of tables (coordinator/maintenance)
        self.cluster: Cluster | None = None
        # Set once running if auth is configured; None means every request is anonymous and allowed.
        self.authority: Authority | None = None

    def service(self, fmt: Format[S]) -> S:
        """The service of a format this coordinator serves (once open)."""
        return self._formats[fmt.name]

    def __getattr__(self, name: str) -> Any:
        """A format's service by the format's name (`coordinator.iceberg`), once open."""
        formats = self.__dict__.get("_formats", {})
        if name in formats:
            return formats[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r} (nor a format of that name)")

    def open(self) -> None:
        """Blocking start-up: database (embedded if no URL), migrations, the storage thread."""
        self.config.check_exposure()
        self.auth = AuthConfig.load(self.config.auth_file, self.formats.grants) if self.config.auth_file else None
        dsn = self.config.database_url
        if not dsn:
            self.embedded = EmbeddedPostgres(self.config.data_dir / "postgres")
            dsn = self.embedded.start()
        self.store = PostgresStore(dsn, pool_size=self.config.db_pool_size, timeout_s=self.config.db_timeout_s,
                                   fenced=self.config.cluster, feed_pool_size=self.config.feed_db_pool_size)
        self.store.on_flush = self.metrics.db_write.observe
        try:
            self.store.open()
        except DatabaseInUse as exc:
            self.store.close()
            raise ConfigError(str(exc)) from None
        except DatabaseUnreachable as exc:
            self.store.close()
            raise ConfigError(f"{exc}; check --database-url and that the server is running and accepts "
                              "this user") from None
        self.registry = Registry(self.config, self.store, self.files, self.metrics)
        self.feed = Feed(self.store, self.config, self.formats.names)
        self.metrics.add_gauges(lambda: {"coordinator_feed_waiting_readers": self.feed.waiting})
        self.idempotency = Idempotency(self.store)
        uses = [use for fmt in self.formats for use in fmt.warehouses]
        self.warehouses = Warehouses(self.config, self.store, self.files, uses)
        self.services = services = Services(self.config, self.formats, self.store, self.files, self.metrics,
                                            self.registry, self.feed, self.idempotency, self.warehouses, self.auth)
        for fmt in self.formats:
            for kind, rows in fmt.tables.items():
                self.registry.register_format(kind, functools.partial(rows.load, services), rows.compaction,
                                              fmt.name, fmt.securable)
            if fmt.purge is not None:
                self.registry.register_purge_listing(fmt.name, fmt.purge)
            self._formats[fmt.name] = fmt.service(services)
        self.uniform = UniformCatalog(services, self.service(DELTA))
        self.converter = Converter(services, self.uniform)
        self.uniform.loaded = self.converter.written
        self.maintainer = Maintainer(services, self.service(ICEBERG))
        if self.config.cluster:
            self.cluster = Cluster(services)

    def close(self, *, stop_embedded: bool = False) -> None:
        """Stops the storage thread. The embedded PostgreSQL keeps running unless asked (a restarted service
        reuses it), mirroring how a real deployment's database outlives the service; asked, it still keeps running
        while another process uses it."""
        if self.store is not None:
            self.store.close()
        if stop_embedded and self.embedded is not None:
            self.embedded.stop_unless_shared(APPLICATION_NAME)

    async def hand_over(self) -> None:
        """Before a graceful stop cancels `run`: a cluster member hands its tables to the other members (answering
        what it accepted first), so that clients see no error. Nothing to do for a single process."""
        if self.cluster is not None:
            await self.cluster.hand_over(self.config.shutdown_grace_s)

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Runs the actors (and background jobs) until cancelled."""
        if self.auth is not None:
            key = self.auth.signing_key or await self.store.signing_key(new_signing_key())
            c = self.config
            self.authority = Authority(self.auth, key, Throttle(c.token_requests_per_s, c.token_requests_burst,
                                                                c.token_requests_queued, c.token_failures_per_s,
                                                                c.token_failures_burst))
        await self.warehouses.load()
        async with trio.open_nursery() as nursery:
            await nursery.start(self.feed.run)
            await nursery.start(self.registry.run)
            if self.cluster is not None:
                await nursery.start(self.cluster.run)
            nursery.start_soon(_expire_forever, "idempotency keys",
                               lambda: self.store.purge_idempotency(RETAIN_S))
            retain_s = self.config.metrics_report_retain_s
            reports = [fmt.reports for fmt in self.formats if fmt.reports is not None]
            nursery.start_soon(_expire_forever, "metrics reports", lambda: self.store.purge_reports(reports, retain_s),
                               min(300.0, retain_s / 2))
            c = self.config
            nursery.start_soon(_expire_forever, "feed events",
                               lambda: self.store.events.prune(c.events_retention_s, c.events_max), PRUNE_EVERY_S)
            await nursery.start(self.converter.run)
            await nursery.start(self.maintainer.run)
            task_status.started(self)


async def _expire_forever(what: str, purge: Callable[[], Awaitable[int]], every_s: float = 300.0) -> None:
    """Every `every_s`, delete the rows of `what` that have expired (`purge` returns how many)."""
    while True:
        await trio.sleep(every_s)
        try:
            n = await purge()
            if n:
                log.info("deleted %d expired %s", n, what)
        except (CoordinatorError, StorageError) as exc:
            log.warning("deleting expired %s failed: %s", what, exc)
