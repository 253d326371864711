"""`coordinator warehouse create|list|drop`: the warehouses REST API (api/warehouses.py) from a shell.

Plain urllib: a few requests need no HTTP client library.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:8181"


def add_warehouse_commands(sub) -> None:
    w = sub.add_parser("warehouse", help="create, list or drop warehouses of a running service")
    w.add_argument("--url", default=os.environ.get("COORDINATOR_URL", DEFAULT_URL),
                   help=f"the service's base URL (env COORDINATOR_URL, default {DEFAULT_URL})")
    w.add_argument("--token", default=os.environ.get("COORDINATOR_TOKEN"),
                   help="bearer token of a client with `admin` on `*`, when authentication is on "
                        "(env COORDINATOR_TOKEN)")
    actions = w.add_subparsers(dest="action", required=True)
    c = actions.add_parser("create", help="add a warehouse: NAME and its root LOCATION (file:///path, s3://b/p)")
    c.add_argument("name")
    c.add_argument("location")
    c.add_argument("--endpoint", help="S3 API URL (an S3-compatible server other than AWS)")
    c.add_argument("--region", help="S3 region")
    c.add_argument("--path-style", action=argparse.BooleanOptionalAction, default=None,
                   help="address buckets as ENDPOINT/BUCKET (--path-style) or BUCKET.ENDPOINT (--no-path-style)")
    c.add_argument("--profile", help="take S3 credentials from this AWS profile")
    c.add_argument("--access-key-id", help="S3 access key the service uses (with --secret-access-key)")
    c.add_argument("--secret-access-key", help="S3 secret key (default: env AWS_SECRET_ACCESS_KEY when "
                                               "--access-key-id is given)")
    actions.add_parser("list", help="list warehouses")
    d = actions.add_parser("drop", help="drop an empty warehouse")
    d.add_argument("name")


def _storage(args) -> dict:
    storage: dict = {}
    for key in ("endpoint", "region", "path_style"):
        if getattr(args, key) is not None:
            storage[key] = getattr(args, key)
    if args.profile:
        storage.update(credentials="profile", profile=args.profile)
    if args.access_key_id:
        secret = args.secret_access_key or os.environ.get("AWS_SECRET_ACCESS_KEY")
        storage.update(credentials="keys", access_key_id=args.access_key_id, secret_access_key=secret)
    return storage


def call_api(args, method: str, path: str, body: dict | None = None) -> tuple[int, dict | None]:
    url = args.url.rstrip("/") + "/api/coordinator/v1" + path
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"error": {"message": raw.decode(errors="replace")}}


def answered(args, method: str, path: str, body: dict | None = None) -> dict | None:
    """The service's answer to the call, or None once what went wrong is printed (unreachable, refused)."""
    try:
        status, answer = call_api(args, method, path, body)
    except (urllib.error.URLError, OSError) as exc:
        print(f"coordinator: cannot reach {args.url} ({exc}); is `coordinator serve` running there? "
              f"(--url to point elsewhere)", file=sys.stderr)
        return None
    if status >= 400:
        message = (answer or {}).get("error", {}).get("message", f"HTTP {status}")
        print(f"coordinator: {message}", file=sys.stderr)
        return None
    return answer or {}


def run_warehouse_command(args) -> int:
    if args.action == "create":
        answer = answered(args, "POST", "/warehouses",
                          {"name": args.name, "location": args.location, "storage": _storage(args)})
    elif args.action == "list":
        answer = answered(args, "GET", "/warehouses")
    else:
        answer = answered(args, "DELETE", f"/warehouses/{urllib.request.quote(args.name, safe='')}")
    if answer is None:
        return 1
    if args.action == "list":
        for w in answer["warehouses"]:
            print(f"{w['name']}\t{w['location']}")
    elif args.action == "create":
        print(f"created warehouse {answer['name']} at {answer['location']}")
    else:
        print(f"dropped warehouse {args.name}")
    return 0
