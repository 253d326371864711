"""The `coordinator` console script."""

from __future__ import annotations

import argparse
import sys
from importlib import metadata

from coordinator.config import Config, ConfigError

from .warehouse_cli import add_warehouse_commands, run_warehouse_command
from .maintenance_cli import add_table_commands, run_table_command


DESCRIPTION = """\
The commit authority for lakehouse tables: one service answering the Iceberg REST Catalog protocol, Unity Catalog's
API for Delta tables (under /api/2.1/unity-catalog) and the Lance Namespace REST protocol, with table state kept in
PostgreSQL. Every option can also be given as an environment variable COORDINATOR_<OPTION> (e.g. COORDINATOR_PORT);
the command line wins."""


def default(field: str, text: str | None = None) -> str:
    """`(env COORDINATOR_X, default: ...)` for a Config field: defaults come from Config, never repeated by hand."""
    value = text if text is not None else Config.__dataclass_fields__[field].default
    return f"(env COORDINATOR_{field.upper()}, default: {value})"


def package_version() -> str:
    try:
        return metadata.version("table-commit-coordinator")
    except metadata.PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coordinator", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the service (embedded PostgreSQL unless --database-url is given)",
                       description="Run the service until SIGINT or SIGTERM. With no --database-url it initialises "
                                   "and runs its own PostgreSQL under --data-dir.")
    s.add_argument("--host", help=f"bind address {default('host')}")
    s.add_argument("--port", type=int, help=f"HTTP port {default('port')}")
    s.add_argument("--database-url", help="PostgreSQL URL, e.g. postgresql://user:pass@host:5432/db "
                                          f"{default('database_url', 'an embedded PostgreSQL under --data-dir')}")
    s.add_argument("--data-dir", help="where the embedded database and default warehouse live "
                                      f"{default('data_dir')}")
    s.add_argument("--warehouse", help="root for table locations: a path or s3:// URI "
                                       f"{default('warehouse', '<data-dir>/warehouse')}")
    s.add_argument("--s3-endpoint", help="S3-compatible server for s3:// warehouses, e.g. http://127.0.0.1:9000; "
                                         "credentials come from the AWS_* environment "
                                         "(env COORDINATOR_S3_ENDPOINT, default: AWS)")
    s.add_argument("--s3-region", help="the S3 bucket's region (env COORDINATOR_S3_REGION, default: none)")
    s.add_argument("--s3-path-style", action="store_true", default=None,
                   help="address buckets as http://host/bucket, as most S3-compatible servers need "
                        "(env COORDINATOR_S3_PATH_STYLE, default: off)")
    s.add_argument("--log-level", help=f"debug, info or warning {default('log_level')}")
    s.add_argument("--http-max-connections", type=int,
                   help="most connections open at once; past it a new connection takes the place of an idle one "
                        "(see docs/limits.md) "
                        f"{default('http_max_connections', 'as many as the descriptor limit (ulimit -n) leaves room for, at most 10000')}")
    s.add_argument("--auth-file", help="TOML file of clients, roles and grants: turns on authentication "
                                       f"(see docs/authentication.md) {default('auth_file', 'none: authentication off')}")
    s.add_argument("--insecure", action="store_true", default=None,
                   help="allow listening on a non-loopback address without --auth-file "
                        f"{default('insecure')}")
    s.add_argument("--tls-proxy", action="store_true", default=None,
                   help="clients come over HTTPS through a proxy that ends TLS: the console's sign-in cookie is "
                        f"Secure and its form must come from https:// {default('tls_proxy')}")
    # The commit feed (docs/events.md).
    s.add_argument("--events-retention-s", type=float,
                   help=f"keep the feed's events this long {default('events_retention_s')}")
    s.add_argument("--events-max", type=int, help=f"keep at most this many events {default('events_max')}")
    s.add_argument("--uniform-workers", type=int,
                   help="worker processes converting Delta tables to Iceberg for UniForm readers, 0 = none "
                        f"{default('uniform_workers')}")
    s.add_argument("--rebase-appends", action="store_true", default=None,
                   help="new Iceberg tables rebase concurrent appends instead of answering 409 (table property "
                        f"commit.rebase-appends.enabled, docs/rebasing.md) {default('rebase_appends')}")
    h = sub.add_parser("hash-secret", help="hash a client secret for the auth file (reads it from stdin)")
    h.add_argument("--secret", help="the secret (default: read one line from stdin)")
    # Scale-out (docs/cluster.md).
    s.add_argument("--workers", type=int, help=f"run N member processes on this one port {default('workers')}")
    s.add_argument("--cluster", action="store_true", default=None,
                   help=f"join a cluster of members sharing the database {default('cluster')}")
    s.add_argument("--cluster-host", help=f"internal channel bind address {default('cluster_host')}")
    s.add_argument("--cluster-port", type=int, help=f"internal channel port, 0 = any {default('cluster_port')}")
    s.add_argument("--cluster-advertise", help="host:port other members dial to reach this one; implies "
                                               f"--cluster {default('cluster_advertise', 'none')}")
    s.add_argument("--cluster-secret-file", help="file holding the internal channel's secret, the same on every "
                                                 "member (see docs/cluster.md) "
                                                 f"{default('cluster_secret_file', '<data-dir>/cluster.key')}")
    s.add_argument("--http-fd", type=int, help=argparse.SUPPRESS)  # set by --workers for its processes
    add_warehouse_commands(sub)
    add_table_commands(sub)
    args = parser.parse_args(argv)

    if args.command == "warehouse":
        return run_warehouse_command(args)
    if args.command == "table":
        return run_table_command(args)

    if args.command == "hash-secret":
        from coordinator.auth import hash_secret
        secret = args.secret if args.secret is not None else sys.stdin.readline().rstrip("\n")
        if not secret:
            parser.error("the secret is empty")
        print(hash_secret(secret))
        return 0

    if args.command == "serve":
        from storage.libraries import UntestedLibrary
        try:
            from .server import configure_logging, serve
        except UntestedLibrary as exc:   # a library lacks a private part the service relies on: which, and why
            print(f"coordinator: {exc}", file=sys.stderr)
            return 2
        config = Config.from_env(host=args.host, port=args.port, database_url=args.database_url,
                                 data_dir=args.data_dir, warehouse=args.warehouse, log_level=args.log_level,
                                 s3_endpoint=args.s3_endpoint, s3_region=args.s3_region,
                                 s3_path_style=args.s3_path_style,
                                 auth_file=args.auth_file, insecure=args.insecure, tls_proxy=args.tls_proxy,
                                 workers=args.workers, cluster=args.cluster, cluster_host=args.cluster_host,
                                 cluster_port=args.cluster_port, cluster_advertise=args.cluster_advertise,
                                 cluster_secret_file=args.cluster_secret_file, http_fd=args.http_fd,
                                 uniform_workers=args.uniform_workers, http_max_connections=args.http_max_connections,
                                 events_retention_s=args.events_retention_s, events_max=args.events_max,
                                 rebase_appends=args.rebase_appends)
        configure_logging(config.log_level)
        try:
            serve(config)
        except ConfigError as exc:  # a configuration the service refuses: say what to change
            print(f"coordinator: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
