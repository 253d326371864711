"""The `coordinator` console script."""

from __future__ import annotations

import argparse
import sys

from coordinator.config import Config, ConfigError

from .warehouse_cli import add_warehouse_commands, run_warehouse_command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coordinator", description="Commit coordinator for Iceberg, Delta and Lance")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the service (embedded PostgreSQL unless --database-url is given)")
    s.add_argument("--host", help="bind address (env COORDINATOR_HOST, default 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (env COORDINATOR_PORT, default 8181)")
    s.add_argument("--database-url", help="PostgreSQL DSN (env COORDINATOR_DATABASE_URL); default: embedded")
    s.add_argument("--data-dir", help="where the embedded database and default warehouse live "
                                      "(env COORDINATOR_DATA_DIR, default ./.coordinator)")
    s.add_argument("--warehouse", help="root for table locations: a path or s3:// URI (env COORDINATOR_WAREHOUSE)")
    s.add_argument("--s3-endpoint", help="S3-compatible server for s3:// warehouses, e.g. http://127.0.0.1:9000 "
                                         "(env COORDINATOR_S3_ENDPOINT; default: AWS). Credentials: AWS_* env")
    s.add_argument("--s3-region", help="the S3 bucket's region (env COORDINATOR_S3_REGION)")
    s.add_argument("--s3-path-style", action="store_true", default=None,
                   help="address buckets as http://host/bucket, as most S3-compatible servers need "
                        "(env COORDINATOR_S3_PATH_STYLE)")
    s.add_argument("--log-level", help="debug, info, warning (env COORDINATOR_LOG_LEVEL)")
    s.add_argument("--auth-file", help="TOML file of clients, roles and grants: turns on authentication "
                                       "(env COORDINATOR_AUTH_FILE; see README, Authentication)")
    s.add_argument("--insecure", action="store_true", default=None,
                   help="allow listening on a non-loopback address without --auth-file (env COORDINATOR_INSECURE)")
    h = sub.add_parser("hash-secret", help="hash a client secret for the auth file (reads it from stdin)")
    h.add_argument("--secret", help="the secret (default: read one line from stdin)")
    # Scale-out (README "Running several instances").
    s.add_argument("--workers", type=int, help="run N member processes on this one port (env COORDINATOR_WORKERS)")
    s.add_argument("--cluster", action="store_true", default=None,
                   help="join a cluster of members sharing the database (env COORDINATOR_CLUSTER)")
    s.add_argument("--cluster-host", help="internal channel bind address (env COORDINATOR_CLUSTER_HOST)")
    s.add_argument("--cluster-port", type=int, help="internal channel port, 0 = any (env COORDINATOR_CLUSTER_PORT)")
    s.add_argument("--cluster-advertise", help="host:port other members dial to reach this one; implies "
                                               "--cluster (env COORDINATOR_CLUSTER_ADVERTISE)")
    s.add_argument("--http-fd", type=int, help=argparse.SUPPRESS)  # set by --workers for its processes
    add_warehouse_commands(sub)
    args = parser.parse_args(argv)

    if args.command == "warehouse":
        return run_warehouse_command(args)

    if args.command == "hash-secret":
        from coordinator.auth import hash_secret
        secret = args.secret if args.secret is not None else sys.stdin.readline().rstrip("\n")
        if not secret:
            parser.error("the secret is empty")
        print(hash_secret(secret))
        return 0

    if args.command == "serve":
        from .server import configure_logging, serve
        config = Config.from_env(host=args.host, port=args.port, database_url=args.database_url,
                                 data_dir=args.data_dir, warehouse=args.warehouse, log_level=args.log_level,
                                 s3_endpoint=args.s3_endpoint, s3_region=args.s3_region,
                                 s3_path_style=args.s3_path_style,
                                 auth_file=args.auth_file, insecure=args.insecure,
                                 workers=args.workers, cluster=args.cluster, cluster_host=args.cluster_host,
                                 cluster_port=args.cluster_port, cluster_advertise=args.cluster_advertise,
                                 http_fd=args.http_fd)
        configure_logging(config.log_level)
        try:
            serve(config)
        except ConfigError as exc:  # a configuration the service refuses: say what to change
            print(f"coordinator: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
