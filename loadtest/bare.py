"""The stack's own limit: a bare quart-trio app on hypercorn-trio that parses the same request bodies as the
service's commit routes (same paths, same hypercorn settings) and does nothing else.

    python -m loadtest.bare --port 8282
    python -m loadtest.bare --port 8282 --durable-file --dir /tmp/bare-files

What a commit costs beyond this (pydantic models, commit rules, the actor hop, the storage thread, PostgreSQL
round trip, response building) is the coordinator's own overhead.

`--durable-file` is the floor of a commit that must make one new file durable before it is acknowledged, as an
Iceberg commit (its metadata file) or a Lance commit (its manifest) must: each commit request also writes its
body as a new file the textbook way, in a worker thread: a uniquely named temp file in the table's directory
under `--dir` (the route's table, or Delta's `table_id`), written, fsynced, closed, renamed to its final unique
name, and the directory fsynced; only then the answer. No database, no rules: the work no commit path can skip.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import uuid
from functools import partial

import orjson
import trio
from hypercorn.trio import serve
from quart import Response, request
from quart_trio import QuartTrio

from api.server import hypercorn_config, tune_gc
from coordinator.config import Config

EMPTY = b"{}"


def create_app(durable_dir: str | None = None) -> QuartTrio:
    """The bare app; with `durable_dir`, each commit request also makes its body a durable file under it."""
    app = QuartTrio(__name__)
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    async def parse_only(**_route_args: str) -> Response:
        orjson.loads(await request.get_data())
        return Response(EMPTY, content_type="application/json")

    async def parse_and_write(**route_args: str) -> Response:
        data = await request.get_data()
        body = orjson.loads(data)
        table = route_args.get("table") or route_args.get("id") or body.get("table_id")
        if not isinstance(table, str) or table in ("", ".", "..") or "/" in table:
            return Response(b'{"error":"no table to write for"}', status=400, content_type="application/json")
        await trio.to_thread.run_sync(write_file, durable_dir, table, data)
        return Response(EMPTY, content_type="application/json")

    commit = parse_only if durable_dir is None else parse_and_write
    # The service's commit routes, one per protocol.
    app.add_url_rule("/v1/namespaces/<namespace>/tables/<table>", "iceberg", commit, methods=["POST"])
    app.add_url_rule("/api/2.1/unity-catalog/delta/preview/commits", "delta", commit, methods=["POST"])
    app.add_url_rule("/v1/table/<id>/version/create", "lance", commit, methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', content_type="application/json")

    return app


def write_file(root: str, table: str, data: bytes) -> None:
    """`data` as a new file in `table`'s directory under `root`, durable on return."""
    directory = os.path.join(root, table)
    if not os.path.isdir(directory):   # a table's first file: its directory made durable too
        os.makedirs(directory, exist_ok=True)
        fsync_dir(root)
    name = uuid.uuid4().hex
    tmp = os.path.join(directory, f".{name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(directory, f"{name}.json"))
    fsync_dir(directory)


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8282)
    ap.add_argument("--durable-file", action="store_true",
                    help="each commit request also writes its body as a new durable file (the floor of a commit "
                         "that must make a file durable)")
    ap.add_argument("--dir", type=os.path.abspath,
                    help="with --durable-file: where the files go, one directory per table (default: a temp dir, "
                         "removed on exit)")
    args = ap.parse_args()
    if args.dir and not args.durable_file:
        ap.error("--dir goes with --durable-file")
    durable_dir = own_dir = None
    if args.durable_file:
        durable_dir = args.dir or (own_dir := tempfile.mkdtemp(prefix="bare-durable-"))
        os.makedirs(durable_dir, exist_ok=True)
    config = hypercorn_config(Config(host=args.host, port=args.port))
    tune_gc()  # the service's own garbage-collector settings, so that the two compare like for like
    # Stopped with SIGTERM (loadtest/procs.py): with a temp dir of its own, shut down so that it is removed.
    until = None if own_dir is None else terminated
    try:
        trio.run(partial(serve, create_app(durable_dir), config, shutdown_trigger=until))
    except KeyboardInterrupt:
        pass
    finally:
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)


async def terminated() -> None:
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            return


if __name__ == "__main__":
    main()
