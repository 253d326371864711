"""Running the service: `serve()` for the console script, `EmbeddedService` for programs that embed it.

Embedded use (pipeline orchestrators, tests)::

    from api import EmbeddedService
    with EmbeddedService() as base_url:          # embedded PostgreSQL in a temp data dir, a free port
        catalog = RestCatalog("c", uri=base_url)  # Iceberg: base_url; Lance: base_url; UC: base_url + "/api/2.1/unity-catalog"
"""

from __future__ import annotations

import errno
import gc
import logging
import math
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import trio
from hypercorn.trio import serve as hypercorn_serve

from coordinator.config import Config, ConfigError
from coordinator.format import Formats
from coordinator.service import Coordinator

from .app import create_app
from .dependencies import check_tested_versions
from .protocol import Protocols
from .protocols import PROTOCOLS
from .transport import ConnectionLimit, ServerConfig, use_transport

log = logging.getLogger(__name__)


class JsonFormatter(logging.Formatter):
    """One JSON object per line; fields in docs/observability.md. At the default level every request writes a
    line, so it is written with orjson and the timestamp's second is formatted once per second: a third of the
    stdlib's cost (datetime, json.dumps)."""

    FIELDS = ("request_id", "method", "path", "status", "ms", "error_type", "error", "client_id", "format", "table",
              "version")

    def __init__(self) -> None:
        super().__init__()
        self._second: int | None = None
        self._second_text = ""

    def format(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        out = {"ts": f"{self._second_text}.{int(record.msecs):03d}Z", "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        fields = record.__dict__
        for key in self.FIELDS:
            if key in fields:
                out[key] = fields[key]
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The lines name no source file, thread or process: the logging module need not look them up for every record
    # (the logging HOWTO's "Optimization"; finding the caller walks the stack).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # One line per request comes from our own logger; hypercorn's access log would duplicate it.
    logging.getLogger("hypercorn.access").setLevel(logging.WARNING)


# Connections the kernel holds for the service before it accepts them (capped by net.core.somaxconn). Beyond it a
# client's connect is dropped, and tried again only a second later: under a flood of connects (each accepted and
# closed at the connection maximum) a health check would wait that long. hypercorn's default is 100.
LISTEN_BACKLOG = 2048


def defer_accept_s(config: Config) -> int:
    """How long the kernel holds a new connection that has sent nothing before it hands it to the service
    (`ServerConfig.defer_accept_s`): half the header deadline, so that with the service's own (from the moment it
    gets the connection) such a connection is closed within about one and a half."""
    return max(1, math.ceil(config.http_keep_alive_s / 2))


# The derived connection maximum (`http_max_connections` 0) is at most this: an idle connection costs the service
# some memory besides its descriptor.
DEFAULT_MAX_CONNECTIONS = 10_000


def descriptors_reserved(config: Config, limit: int) -> int:
    """Descriptors kept out of the connections' reach (of the process's `limit`): the database pool's, files being
    read and written, the cluster channel's, the process's own (its log, its listening sockets, the event loop)."""
    return max(128, limit // 8) + config.db_pool_size


def max_connections(config: Config) -> int:
    """How many connections may be open at once: `http_max_connections`, or (0) as many as the process's
    descriptor limit leaves room for beside `descriptors_reserved`, at most DEFAULT_MAX_CONNECTIONS."""
    limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if limit == resource.RLIM_INFINITY:
        return config.http_max_connections or DEFAULT_MAX_CONNECTIONS
    reserved = descriptors_reserved(config, limit)
    room = limit - reserved
    if room < 1 or config.http_max_connections > room:
        asked = f"--http-max-connections {config.http_max_connections}" if config.http_max_connections else "serving"
        raise ConfigError(f"{asked} needs more file descriptors than the process's limit of {limit} (ulimit -n) "
                          f"leaves beside the {reserved} kept for the database, files and the cluster: at most "
                          f"{max(room, 0)} connections fit. Raise the limit (ulimit -n) or lower the setting")
    return config.http_max_connections or min(room, DEFAULT_MAX_CONNECTIONS)


def hypercorn_config(config: Config) -> ServerConfig:
    hc = ServerConfig()
    hc.bind = [f"{config.host}:{config.port}"]
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.keep_alive_timeout = config.http_keep_alive_s  # also bounds slow headers: hypercorn resets it per request
    hc.graceful_timeout = config.shutdown_grace_s
    hc.h11_max_incomplete_size = 64 * 1024
    hc.backlog = LISTEN_BACKLOG
    hc.defer_accept_s = defer_accept_s(config)
    if config.http_fd is not None:  # a worker of `serve --workers N`: the supervisor's shared socket
        hc.bind = [f"fd://{config.http_fd}"]
    hc.connections = ConnectionLimit(max_connections(config))
    return hc


def observe_connections(metrics, limit: ConnectionLimit) -> None:
    metrics.add_gauges(lambda: {"coordinator_http_connections": len(limit.open),
                                "coordinator_http_connections_max": limit.maximum})
    metrics.add_counters(lambda: {"coordinator_http_connections_closed_at_limit_total": limit.closed_at_limit})


async def serve_coordinator(coordinator: Coordinator, *, shutdown: trio.Event | None = None,
                            protocols: Protocols = PROTOCOLS, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the actors and the HTTP server, speaking `protocols`, until `shutdown` is set (or forever)."""
    app = create_app(coordinator, protocols)
    use_transport()
    hc = hypercorn_config(coordinator.config)
    observe_connections(coordinator.metrics, hc.connections)
    trigger = shutdown.wait if shutdown is not None else None
    async with trio.open_nursery() as nursery:
        await nursery.start(coordinator.run)
        async with trio.open_nursery() as http:
            binds = await http.start(lambda task_status: hypercorn_serve(
                app, hc, shutdown_trigger=trigger, task_status=task_status))
            task_status.started(binds)
        # hypercorn returns once its graceful shutdown has drained in-flight requests; a cluster member then
        # hands its tables over (answering the calls other members forwarded to it first).
        await coordinator.hand_over()
        nursery.cancel_scope.cancel()


# The cyclic GC's young generation holds what in-flight requests allocate; with CPython's default threshold (700)
# it ran ~50 times a second under commit load, and the older generations, which walk every loaded table, often
# enough to cost ~9% of the service's CPU with pauses up to ~70 ms. At 20,000 it runs a few times in 10 s for
# ~15 ms each (`loadtest/README.md`, "Garbage collection"). Only the service's own process is tuned: a program
# that embeds the coordinator keeps its own settings.
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Move everything start-up created (modules, the app) out of the collector's sight, then collect rarely."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve(config: Config) -> None:
    """Blocking: start the database (embedded unless configured), then serve until interrupted."""
    check_tested_versions()
    max_connections(config)   # a maximum the descriptor limit cannot hold is refused before anything starts
    if config.workers > 1 and config.http_fd is None:
        from .workers import serve_workers
        return serve_workers(config)
    coordinator = Coordinator(config)
    coordinator.open()
    tune_gc()

    async def main() -> None:
        shutdown = trio.Event()
        # SIGINT/SIGTERM start a graceful stop. Without this, Ctrl-C raises KeyboardInterrupt in whichever
        # connection task happens to run, where hypercorn logs and swallows it.
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(lambda task_status: serve_coordinator(
                    coordinator, shutdown=shutdown, task_status=task_status))
                log.info("coordinator serving on %s (Iceberg REST: %s, Lance REST: %s, Unity Catalog: %s)",
                         binds, binds[0], binds[0], f"{binds[0]}/api/2.1/unity-catalog")
                async for signum in signals:
                    log.info("received %s: shutting down", signal.Signals(signum).name)
                    shutdown.set()
                    break
    try:
        trio.run(main)
    except BaseExceptionGroup as group:  # hypercorn's bind runs in a nursery: its OSError arrives grouped
        in_use, _ = group.split(lambda exc: isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE)
        if in_use is None:
            raise
        raise ConfigError(f"{config.host}:{config.port} is already in use: stop the process holding it "
                          "or choose another with --port") from None
    finally:
        # A graceful stop also stops the embedded database; after a crash it keeps running and the restarted
        # service reuses it.
        coordinator.close(stop_embedded=True)


class EmbeddedService:
    """Runs the service in a background thread on a free port; a context manager yielding its base URL.
    `protocols`: the protocols it speaks, and so the formats it serves (by default the service's own)."""

    def __init__(self, config: Config | None = None, *, protocols: Protocols = PROTOCOLS, **overrides):
        self._tmp: str | None = None
        if config is None:
            if "data_dir" not in overrides:
                self._tmp = tempfile.mkdtemp(prefix="coordinator-")
                Path(self._tmp).chmod(0o755)
                overrides["data_dir"] = self._tmp
            overrides.setdefault("port", 0)
            config = Config(**overrides)
        self.config = config
        self.protocols = protocols
        self.coordinator = Coordinator(config, Formats(tuple(p.format for p in protocols)))
        self.base_url: str | None = None
        self._thread: threading.Thread | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._shutdown: trio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> str:
        check_tested_versions()
        max_connections(self.config)
        self.coordinator.open()
        self._thread = threading.Thread(target=self._main, name="coordinator-embedded", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise RuntimeError(f"embedded coordinator failed to start: {self._error}") from self._error
        return self.base_url

    def _main(self) -> None:
        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            self._shutdown = trio.Event()
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(lambda task_status: serve_coordinator(
                    self.coordinator, shutdown=self._shutdown, protocols=self.protocols, task_status=task_status))
                self.base_url = binds[0]
                self._ready.set()
        try:
            trio.run(main)
        except BaseException as exc:  # surfaced to the starting thread
            self._error = exc
            log.exception("embedded coordinator stopped with an error")
        finally:
            self._ready.set()

    def stop(self) -> None:
        if self._thread is not None and self._token is not None:
            try:
                self._token.run_sync_soon(self._shutdown.set)
            except trio.RunFinishedError:
                pass
            self._thread.join(timeout=30)
        self._thread = None
        self.coordinator.close(stop_embedded=True)
        if self._tmp:
            if self.coordinator.embedded is not None:
                self.coordinator.embedded.destroy()
            shutil.rmtree(self._tmp, ignore_errors=True)
