"""`coordinator table maintain NAME [--dry-run]`: the maintenance REST API (api/maintenance.py) from a shell."""

from __future__ import annotations

import os

from coordinator.iceberg.rows import FORMAT as ICEBERG

from .warehouse_cli import DEFAULT_URL, answered


def add_table_commands(sub) -> None:
    t = sub.add_parser("table", help="maintain tables of a running service")
    actions = t.add_subparsers(dest="action", required=True)
    m = actions.add_parser("maintain", help="expire an Iceberg table's snapshots by its properties now; with "
                                            "--dry-run only print what would be expired and deleted")
    m.add_argument("--url", default=os.environ.get("COORDINATOR_URL", DEFAULT_URL),
                   help=f"the service's base URL (env COORDINATOR_URL, default {DEFAULT_URL})")
    m.add_argument("--token", default=os.environ.get("COORDINATOR_TOKEN"),
                   help="bearer token of a client with `admin` on `*`, when authentication is on "
                        "(env COORDINATOR_TOKEN)")
    m.add_argument("name", help="the table, its namespace levels and name dotted: db.events")
    m.add_argument("--prefix", default="", help="the Iceberg REST prefix (catalog) the table is under, if any")
    m.add_argument("--dry-run", action="store_true", help="change nothing: print what would be expired and deleted")


def run_table_command(args) -> int:
    answer = answered(args, "POST", "/tables/maintain", {"format": ICEBERG, "prefix": args.prefix,
                                                         "name": args.name, "dry-run": args.dry_run})
    if answer is None:
        return 1
    would = "would expire" if args.dry_run else "expired"
    if answer.get("note"):
        print(f"{args.name}: {answer['note']}")
    print(f"{args.name}: {would} {len(answer['expired-snapshots'])} snapshot(s)"
          + (f" and ref(s) {', '.join(answer['removed-refs'])}" if answer["removed-refs"] else ""))
    for snapshot_id in answer["expired-snapshots"]:
        print(f"  snapshot {snapshot_id}")
    if args.dry_run:
        print(f"{args.name}: would delete {len(answer['files'])} file(s)")
        for uri in answer["files"]:
            print(f"  {uri}")
    return 0
