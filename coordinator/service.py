"""The coordinator as one object: its store, file IO, actor registry and the formats' catalogs.

The HTTP layer (`api/`) holds one of these and calls the catalogs; tests and embedding programs may too.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

import trio

from storage.embedded import EmbeddedPostgres
from storage.files import FileIO
from storage.errors import DatabaseUnreachable, StorageError
from storage.owner import DatabaseInUse
from storage.postgres import APPLICATION_NAME, PostgresStore

from .auth import AuthConfig, Authority, Throttle, new_signing_key
from .config import Config, ConfigError
from .errors import CoordinatorError
from .feed import PRUNE_EVERY_S, Feed
from .idempotency import RETAIN_S, Idempotency
from .metrics import Metrics
from .registry import Registry

log = logging.getLogger(__name__)


class Coordinator:
    def __init__(self, config: Config):
        self.config = config
        self.metrics = Metrics()
        self.embedded: EmbeddedPostgres | None = None
        self.store: PostgresStore | None = None
        self.files = FileIO(config.s3_options, config.warehouse_uri)
        self.metrics.add_counters(lambda: {"coordinator_file_write_cpu_seconds_total": self.files.write_cpu_s})
        self.files.on_write = self.metrics.file_write.observe
        self.registry: Registry | None = None
        self.iceberg = None
        self.lance = None
        self.delta = None
        self.uniform = None     # Delta tables read as Iceberg (coordinator/uniform) ...
        self.converter = None   # ... and converted for the writers that send no Iceberg metadata
        self.maintainer = None  # the service's own maintenance of tables (coordinator/maintenance)
        self.auth: AuthConfig | None = None
        # Set once running if auth is configured; None means every request is anonymous and allowed.
        self.authority: Authority | None = None

    def open(self) -> None:
        """Blocking start-up: database (embedded if no URL), migrations, the storage thread."""
        self.config.check_exposure()
        self.auth = AuthConfig.load(self.config.auth_file) if self.config.auth_file else None
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
        self.feed = Feed(self.store, self.config)
        self.metrics.add_gauges(lambda: {"coordinator_feed_waiting_readers": self.feed.waiting})
        self.idempotency = Idempotency(self.store)
        from .warehouses import Warehouses; self.warehouses = Warehouses(self)  # noqa: E702
        from .iceberg.service import IcebergService; self.iceberg = IcebergService(self)  # noqa: E702
        from .delta.service import DeltaService; self.delta = DeltaService(self)  # noqa: E702
        from .lance.service import LanceService; self.lance = LanceService(self)  # noqa: E702
        from .uniform import Converter, UniformCatalog; self.uniform = UniformCatalog(self)  # noqa: E702
        self.converter = Converter(self)
        from .maintenance import Maintainer; self.maintainer = Maintainer(self)  # noqa: E702
        self.cluster = None
        if self.config.cluster:
            from .cluster import Cluster
            self.cluster = Cluster(self)

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
            nursery.start_soon(_expire_forever, "metrics reports", lambda: self.store.purge_reports(retain_s),
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
