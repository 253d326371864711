"""A table whose metadata is large (here ~360 KiB, 1,500 snapshots) is answered part by part, not joined into one
more copy (`api.common.json_response`): the answers must still be exactly the JSON the spec describes, with a
true Content-Length, to raw HTTP, to pyiceberg and to an Idempotency-Key replay."""

from __future__ import annotations

import random

import orjson
import pytest
from pyiceberg.catalog import load_catalog

from api.common import STREAM_PARTS_FROM
from tests.support import iceberg_table_client

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
SNAPSHOTS = 1500


@pytest.fixture
def http(service):
    with iceberg_table_client(service, SCHEMA) as client:
        yield client


def snapshot_updates(count: int, parent: int | None, seq: int) -> tuple[list, int]:
    rng = random.Random(7)
    updates = []
    for _ in range(count):
        seq += 1
        sid = rng.getrandbits(62)
        snap = {"snapshot-id": sid, "sequence-number": seq, "timestamp-ms": 1_700_000_000_000 + seq,
                "manifest-list": f"file:///tmp/unused/snap-{sid}.avro", "summary": {"operation": "append"},
                "schema-id": 0}
        if parent is not None:
            snap["parent-snapshot-id"] = parent
        updates += [{"action": "add-snapshot", "snapshot": snap},
                    {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch", "snapshot-id": sid}]
        parent = sid
    return updates, parent


def test_a_large_commit_answer_and_load_are_whole_json_with_a_true_length(service, http):
    updates, head = snapshot_updates(SNAPSHOTS, None, 0)
    body = {"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": None}],
            "updates": updates}
    headers = {"Idempotency-Key": "0190a0b0-0000-7000-8000-000000000001"}
    committed = http.post("/v1/namespaces/db/tables/t", json=body, headers=headers)
    assert committed.status_code == 200, committed.text
    assert len(committed.content) > STREAM_PARTS_FROM  # large enough to be sent in parts
    assert int(committed.headers["content-length"]) == len(committed.content)
    answer = orjson.loads(committed.content)
    assert set(answer) == {"metadata-location", "metadata"}
    assert answer["metadata"]["current-snapshot-id"] == head
    assert len(answer["metadata"]["snapshots"]) == SNAPSHOTS

    loaded = http.get("/v1/namespaces/db/tables/t")
    assert loaded.status_code == 200 and int(loaded.headers["content-length"]) == len(loaded.content)
    assert loaded.headers["etag"] == committed.headers["etag"]
    result = orjson.loads(loaded.content)
    assert result["metadata-location"] == answer["metadata-location"]
    assert result["metadata"] == answer["metadata"]

    replayed = http.post("/v1/namespaces/db/tables/t", json=body, headers=headers)
    assert replayed.status_code == 200 and replayed.content == committed.content

    table = load_catalog("rest", type="rest", uri=service).load_table("db.t")
    assert table.metadata.current_snapshot_id == head and len(table.metadata.snapshots) == SNAPSHOTS
