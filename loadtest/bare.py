"""The stack's own limit: a bare quart-trio app on hypercorn-trio that parses the same request bodies as the
service's commit routes (same paths, same hypercorn settings) and does nothing else.

    python -m loadtest.bare --port 8282

What a commit costs beyond this (pydantic models, commit rules, the actor hop, the storage thread, PostgreSQL
round trip, response building) is the coordinator's own overhead.
"""

from __future__ import annotations

import argparse

import orjson
import trio
from hypercorn.trio import serve
from quart import Response, request
from quart_trio import QuartTrio

from api.server import hypercorn_config, tune_gc
from coordinator.config import Config

EMPTY = b"{}"


def create_app() -> QuartTrio:
    app = QuartTrio(__name__)
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False

    async def parse_only(**_route_args: str) -> Response:
        orjson.loads(await request.get_data())
        return Response(EMPTY, content_type="application/json")

    # The service's commit routes, one per protocol.
    app.add_url_rule("/v1/namespaces/<namespace>/tables/<table>", "iceberg", parse_only, methods=["POST"])
    app.add_url_rule("/api/2.1/unity-catalog/delta/preview/commits", "delta", parse_only, methods=["POST"])
    app.add_url_rule("/v1/table/<id>/version/create", "lance", parse_only, methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response(b'{"status":"ok"}', content_type="application/json")

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8282)
    args = ap.parse_args()
    config = hypercorn_config(Config(host=args.host, port=args.port))
    tune_gc()  # the service's own garbage-collector settings, so that the two compare like for like
    try:
        trio.run(serve, create_app(), config)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
