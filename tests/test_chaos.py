"""Chaos: SIGKILL the service again and again under mixed Iceberg + Delta + Lance commit load, restart it on the
same port, and replay the clients' log of answers against the final state.

Every commit carries an id of its own: Iceberg in its snapshot's summary (`chaos-id`), Delta in the ratified file
name, Lance in the version's metadata and in the manifest's bytes. A client that gets no answer (the connection
dropped mid-request) or a 5xx does not know whether its commit landed. A *patient* writer sends the very same
request again (Iceberg with the same Idempotency-Key) until it gets an answer, which settles the doubt; an
*impatient* one gives up and logs the commit as "unknown". Only a 2xx is an acknowledgement.

The checker (`check`, a pure function of the log and the state read back) requires:

* lost = 0: every acknowledged commit is present, at the version it was acknowledged at;
* duplicated = 0: no commit id appears twice in a table, unknown ones included;
* phantom = 0: no commit refused with a 4xx is present;
* the commit feed (docs/events.md) reports every version each table holds once, in order, and nothing else;
* contiguous versions: Iceberg snapshot sequence numbers 1..N, every snapshot an ancestor of main, the
  snapshot-log equal to main's ancestry and the metadata files numbered without holes; Delta versions 0..N, the
  tail GET commits serves (page by page) equal to the commit log; Lance versions 1..N, each manifest on disk
  holding its commit's bytes and no other manifest there;
* the Iceberg table with rebasing on (tests/chaos_rebase.py), where two writers race with real manifest lists
  and most commits are rebased: every snapshot of main holds exactly its parent's data files plus its own;
* the Delta table the service converts to Iceberg (UniForm, tests/chaos_uniform.py; not in the power-loss mode,
  whose cuts take the writers' unsynced files): after every restart its Iceberg side shows no Delta version the
  Delta side lacks, and at the end it has caught up, each snapshot holding exactly its versions' data files.

pytest runs `COORDINATOR_CHAOS_CYCLES` (3) cycles, plus the crash-point and power-loss modes (docs/durability.md);
`python -m tests.test_chaos --cycles 20` runs on its own
throwaway PostgreSQL, prints progress per cycle and the figures, and exits 1 when the check fails.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from coordinator.client import events
from coordinator.lance.layout import object_path, version_of_manifest_name
from tests import chaos_rebase, chaos_uniform
from tests.chaos_crash_points import CRASH_POINTS, CRASH_WAIT_S, AimedCrashes, start_armed, wait_for_death
from tests.chaos_power import PowerLoss, iceberg_read_back, skip_reason
from tests.delta.conftest import FIRST, PREFIX, UC, commit_info, commit_log
from tests.chaos_files import ClientFiles
from tests.support import MotoS3, ServerProcess, throwaway_postgres, uuid7

pytestmark = pytest.mark.chaos

FORMATS = ("iceberg", "delta", "lance")
TABLES = ("t0", "t1", "t2", "tx")
WRITERS_PER_FORMAT = 4           # writer w writes TABLES[w % 3]: t0 has two writers racing, t1 and t2 one each
# Two writers commit to tx of all three formats at once, racing each other and one single-format writer per format
# there. That one pauses between commits: a cross-format commit must win the race on all three tables, and
# against writers that never pause it would (rightly) almost never win.
CROSS_FORMAT_TABLE, CROSS_FORMAT_WRITERS, CROSS_FORMAT_RIVAL_PAUSE_S = "tx", 2, 0.2
CROSS_FORMAT_COMMIT = "/api/coordinator/v1/commit"
ICEBERG_NS, LANCE_NS, DELTA_SCHEMA = "chaos_ice", "chaos_lance", "chaos"
SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "type": "long", "required": False}]}
# Small pages, so that reading the state back crosses page boundaries (Delta GET commits, Lance version list).
DELTA_PAGE_SIZE = 3
LANCE_PAGE_SIZE = 7
# Delta writers report versions up to `latest - lag` as published: a few ratified commits stay unpublished, so
# GET commits has a tail to serve after every restart (the limit of unpublished commits is 10).
DELTA_PUBLISH_LAG = 4
RETRY_PAUSE_S = 0.05
CLIENT_FILES = ClientFiles()   # where the Lance writers' staged manifests go (run_chaos sets it)
START_TIMEOUT_S = 120   # a restart on a busy machine (replaying WAL after a power loss, say) may be slow


# -- the clients' log --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What one commit's client knows at the end. `version` is the version the commit asked for; for an
    acknowledged commit it is the version the service acknowledged."""

    fmt: str
    table: str
    cid: str
    status: str             # "acked" (2xx), "rejected" (4xx: changed nothing), "unknown" (no answer; gave up)
    version: int
    in_doubt: bool = False  # some attempt ended without an answer (dropped connection or 5xx)
    across: bool = False    # one part of a cross-format commit (its cid names one commit in every format)


class ClientLog:
    """Shared by the writer threads: every commit's outcome, and every failed attempt by error class."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: list[Outcome] = []
        self.errors: Counter[tuple[str, str]] = Counter()

    def record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def error(self, fmt: str, kind: str) -> None:
        with self._lock:
            self.errors[fmt, kind] += 1

    def acked(self) -> Counter[str]:
        with self._lock:
            return Counter(o.fmt for o in self.outcomes if o.status == "acked")

    def acked_ids(self, fmt: str) -> dict[str, set[str]]:
        """Table -> ids of the commits acknowledged on it so far."""
        with self._lock:
            out: dict[str, set[str]] = {}
            for o in self.outcomes:
                if o.fmt == fmt and o.status == "acked":
                    out.setdefault(o.table, set()).add(o.cid)
            return out


# -- the checker -------------------------------------------------------------------------------------------------


@dataclass
class TableState:
    """One table as read back: its versions, each with the id of the commit that made it (None for versions no
    chaos writer made, such as Delta's version 0), and what the reader found inconsistent between the views."""

    fmt: str
    table: str
    first: int                                   # the format's first version
    entries: list[tuple[int, str | None]]
    anomalies: list[str] = field(default_factory=list)


@dataclass
class Figures:
    counts: dict[str, Counter] = field(default_factory=lambda: {f: Counter() for f in FORMATS})
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    phantom: list[str] = field(default_factory=list)
    non_contiguous: list[str] = field(default_factory=list)
    inconsistent: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)   # a cross-format commit present in some formats, not all

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.phantom or self.non_contiguous or self.inconsistent
                    or self.torn)

    def problems(self) -> str:
        out = []
        for name in ("lost", "duplicated", "phantom", "non_contiguous", "inconsistent", "torn"):
            items = getattr(self, name)
            if items:
                out.append(f"{name} ({len(items)}): " + "; ".join(items[:10]))
        return "\n".join(out)


def check(outcomes: Iterable[Outcome], states: Iterable[TableState]) -> Figures:
    """Replay the clients' log against the state read back. Pure: no I/O, so it can be shown to fail."""
    f = Figures()
    found: dict[tuple[str, str, str], list[int]] = {}
    for s in states:
        versions = sorted(v for v, _ in s.entries)
        if versions != list(range(s.first, s.first + len(versions))):
            f.non_contiguous.append(f"{s.fmt} {s.table}: versions {_spans(versions)}, expected "
                                    f"{s.first}..{s.first + len(versions) - 1}")
        for v, cid in s.entries:
            if cid is not None:
                found.setdefault((s.fmt, s.table, cid), []).append(v)
        f.inconsistent += [f"{s.fmt} {s.table}: {a}" for a in s.anomalies]
    for (fmt, table, cid), versions in found.items():
        if len(versions) > 1:
            f.duplicated.append(f"{fmt} {table}: commit {cid} at versions {sorted(versions)}")
    sent = set()
    across: dict[str, dict[str, bool]] = {}   # cross-format commit id -> format -> present
    for o in outcomes:
        if o.across:
            across.setdefault(o.cid, {})[o.fmt] = (o.fmt, o.table, o.cid) in found
        key = (o.fmt, o.table, o.cid)
        sent.add(key)
        where = found.get(key, [])
        c = f.counts[o.fmt]
        c[o.status] += 1
        c["in doubt"] += o.in_doubt
        if o.status == "acked":
            if o.version not in where:
                at = f"found at {sorted(where)}" if where else "absent"
                f.lost.append(f"{o.fmt} {o.table}: commit {o.cid} acknowledged at version {o.version}, {at}")
        elif o.status == "rejected":
            if where:
                f.phantom.append(f"{o.fmt} {o.table}: commit {o.cid} was refused, yet is at {sorted(where)}")
        elif where:
            c["unknown, landed"] += 1
    for key in found.keys() - sent:
        f.inconsistent.append(f"{key[0]} {key[1]}: commit {key[2]} is in the table, but no writer sent it")
    for cid, present in across.items():
        if len(set(present.values())) > 1:
            f.torn.append(f"cross-format commit {cid}: present in {sorted(k for k, v in present.items() if v)}, "
                          f"absent from {sorted(k for k, v in present.items() if not v)}")
    return f


def read_feed(base: str) -> dict[tuple[str, str], list[int]]:
    """(format, table) -> the versions the commit feed reports committed, in feed order."""
    out: dict[tuple[str, str], list[int]] = {}
    for e in events(base, follow=False, limit=1000):
        if e["type"].endswith(".committed"):
            out.setdefault((e["data"]["format"], e["data"]["name"][-1]), []).append(e["data"]["version"])
    return out


def check_feed(feed: dict[tuple[str, str], list[int]], states: Iterable[TableState]) -> list[str]:
    """The feed against the tables read back: every version a commit made (from 1 on; a table's creation makes
    its first) reported once, in version order, and no other. Pure, like `check`. (For Iceberg the feed's version
    is the metadata file's number, equal to the snapshot's sequence number here: every commit adds one.)"""
    problems, seen = [], set()
    for s in states:
        seen.add((s.fmt, s.table))
        held = sorted(v for v, _ in s.entries if v >= 1)
        reported = feed.get((s.fmt, s.table), [])
        missing = sorted(set(held) - set(reported))
        extra = sorted((Counter(reported) - Counter(held)).elements())
        if missing:
            problems.append(f"feed {s.fmt} {s.table}: versions {_spans(missing)} missing")
        if extra:
            problems.append(f"feed {s.fmt} {s.table}: versions {_spans(extra)} reported but not held (or twice)")
        if reported != sorted(reported):
            problems.append(f"feed {s.fmt} {s.table}: versions out of order")
    problems += [f"feed {fmt} {table}: events for a table not read back" for fmt, table in feed.keys() - seen]
    return problems


def _spans(versions: list[int]) -> str:
    """[0, 1, 2, 5, 6] -> '0..2, 5..6' (the first few runs)."""
    runs: list[list[int]] = []
    for v in versions:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in runs[:6])
    return text + (", ..." if len(runs) > 6 else "")


# -- writers -----------------------------------------------------------------------------------------------------


class Writer(abc.ABC):
    """One client thread committing to one table of one format, over raw HTTP."""

    fmt = ""

    def __init__(self, base: str, table: str, log: ClientLog, stop: threading.Event, give_up: threading.Event,
                 *, patient: bool, pause_s: float = 0.0):
        self.base, self.table, self.log = base, table, log
        self.stop, self.give_up, self.patient, self.pause_s = stop, give_up, patient, pause_s
        self.http = httpx.Client(base_url=base, timeout=10)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self.commit_once()
                if self.pause_s:
                    self.stop.wait(self.pause_s)
        finally:
            self.http.close()

    def commit_once(self) -> None:
        """Read the table, make one commit with a new id, and log its outcome."""
        cid = uuid.uuid4().hex
        prepared = self.prepare(cid)
        if prepared is None:
            return
        body, version = prepared
        key = uuid7()
        status, doubt = self.send(lambda: self.post(body, key))
        acknowledged = self.settle(status)
        self.log.record(Outcome(self.fmt, self.table, cid, status, version if acknowledged is None else acknowledged,
                                doubt))

    @abc.abstractmethod
    def prepare(self, cid: str) -> tuple[dict, int] | None:
        """The next commit's body and the version it asks for (None when the run is over)."""

    @abc.abstractmethod
    def post(self, body: dict, key: str) -> httpx.Response:
        """Send the commit to the format's own endpoint."""

    @abc.abstractmethod
    def part(self, body: dict) -> dict:
        """The same commit as a part of a cross-format commit."""

    def settle(self, status: str) -> int | None:
        """After the commit's outcome is known; the version it was acknowledged at, if not the one it asked for."""

    def read(self, send: Callable[[], httpx.Response]) -> dict | None:
        """A read that must succeed; retried through the restarts. None when the run is over."""
        while not self.give_up.is_set() and not self.stop.is_set():
            try:
                r = send()
            except httpx.HTTPError as exc:
                self.log.error(self.fmt, "read " + type(exc).__name__)
            else:
                if r.status_code == 200:
                    return r.json()
                self.log.error(self.fmt, f"read {r.status_code}")
            time.sleep(RETRY_PAUSE_S)
        return None

    def send(self, send: Callable[[], httpx.Response]) -> tuple[str, bool]:
        """Send one commit until the service answers it. Returns (status, in_doubt)."""
        in_doubt = False
        while True:
            try:
                r = send()
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                self.log.error(self.fmt, type(exc).__name__)     # nothing reached the service: no new doubt
            except httpx.HTTPError as exc:
                self.log.error(self.fmt, type(exc).__name__)     # sent, and the connection died: in doubt
                in_doubt = True
            else:
                if r.status_code < 300:
                    return "acked", in_doubt
                self.log.error(self.fmt, str(r.status_code))
                if r.status_code < 500:
                    return "rejected", in_doubt
                in_doubt = True                                  # 5xx (503 included): the outcome is not known
            if (in_doubt and not self.patient) or self.give_up.is_set():
                return "unknown", in_doubt
            time.sleep(RETRY_PAUSE_S)


class IcebergWriter(Writer):
    """Adds one snapshot per commit on top of main (assert-ref-snapshot-id), moving main to it. A patient retry
    resends the same body with the same Idempotency-Key: a commit that landed is answered from the stored answer,
    one that did not runs again."""

    fmt = "iceberg"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.path = f"/v1/namespaces/{ICEBERG_NS}/tables/{self.table}"
        self.view: tuple[int | None, int, str] | None = None   # (main's snapshot id, last sequence number, location)

    def prepare(self, cid: str) -> tuple[dict, int] | None:
        if self.view is None:
            loaded = self.read(lambda: self.http.get(self.path, params={"snapshots": "refs"}))
            if loaded is None:
                return None
            md = loaded["metadata"]
            self.view = (md["refs"].get("main", {}).get("snapshot-id"), md["last-sequence-number"], md["location"])
        parent, last_seq, location = self.view
        snapshot_id = uuid.uuid4().int >> 66
        snapshot = {"snapshot-id": snapshot_id, "sequence-number": last_seq + 1, "timestamp-ms": _now_ms(),
                    "manifest-list": f"{location}/metadata/snap-{snapshot_id}-{cid}.avro",
                    "summary": {"operation": "append", "chaos-id": cid}, "schema-id": 0}
        if parent is not None:
            snapshot["parent-snapshot-id"] = parent
        body = {"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": parent}],
                "updates": [{"action": "add-snapshot", "snapshot": snapshot},
                            {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch",
                             "snapshot-id": snapshot_id}]}
        self.next_view = (snapshot_id, last_seq + 1, location)
        return body, last_seq + 1

    def post(self, body: dict, key: str) -> httpx.Response:
        return self.http.post(self.path, json=body, headers={"Idempotency-Key": key})

    def part(self, body: dict) -> dict:
        return {"format": "iceberg", "identifier": {"namespace": [ICEBERG_NS], "name": self.table}, **body}

    def settle(self, status: str) -> None:
        self.view = self.next_view if status == "acked" else None


class RebasingWriter(IcebergWriter):
    """On the Iceberg table with rebasing on (tests/chaos_rebase.py): each commit writes its manifest and manifest
    list on the snapshot it last saw, racing the other writers there, so that most commits are rebased by the
    service. It is acknowledged at the sequence number the answer shows, and goes on from the snapshot the answer
    made main (a rebased commit's parent and manifest list are not what it sent)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.files = chaos_rebase.AppendFiles(CLIENT_FILES)
        self.answer: httpx.Response | None = None
        self.snapshot_id = 0

    def prepare(self, cid: str) -> tuple[dict, int] | None:
        if self.view is None:
            loaded = self.read(lambda: self.http.get(self.path, params={"snapshots": "refs"}))
            if loaded is None:
                return None
            self.view = self._view(loaded["metadata"])
        parent, last_seq, location, parent_list = self.view
        self.snapshot_id = uuid.uuid4().int >> 66
        manifest_list = self.files.write(location, cid, self.snapshot_id, parent_list, parent, last_seq + 1)
        snapshot = {"snapshot-id": self.snapshot_id, "sequence-number": last_seq + 1, "timestamp-ms": _now_ms(),
                    "manifest-list": manifest_list, "schema-id": 0,
                    "summary": {"operation": "append", "chaos-id": cid, "added-data-files": "1",
                                "added-records": "1"}}
        if parent is not None:
            snapshot["parent-snapshot-id"] = parent
        body = {"requirements": [{"type": "assert-ref-snapshot-id", "ref": "main", "snapshot-id": parent}],
                "updates": [{"action": "add-snapshot", "snapshot": snapshot},
                            {"action": "set-snapshot-ref", "ref-name": "main", "type": "branch",
                             "snapshot-id": self.snapshot_id}]}
        return body, last_seq + 1

    @staticmethod
    def _view(md: dict) -> tuple:
        head = md["refs"].get("main", {}).get("snapshot-id")
        listed = next((s["manifest-list"] for s in md["snapshots"] if s["snapshot-id"] == head), None)
        return head, md["last-sequence-number"], md["location"], listed

    def post(self, body: dict, key: str) -> httpx.Response:
        self.answer = self.http.post(self.path, json=body, headers={"Idempotency-Key": key})
        return self.answer

    def settle(self, status: str) -> int | None:
        self.view = None
        if status != "acked":
            return None
        md = self.answer.json()["metadata"]
        self.view = self._view(md)
        return next(s["sequence-number"] for s in md["snapshots"] if s["snapshot-id"] == self.snapshot_id)


class DeltaWriter(Writer):
    """Ratifies version latest + 1 as `<version>.<commit id>.json`, reporting older versions as published. A retry
    of the same commit is a no-op 200 if it was ratified, a 409 if another writer took the version. Every other
    version goes through the Delta API v1.0 (updateTable: add-commit and set-latest-backfilled-version), the rest
    through the preview API: one table, one history."""

    fmt = "delta"

    def __init__(self, *args, table_info: dict, **kwargs):
        super().__init__(*args, **kwargs)
        self.q = {"table_id": table_info["table_id"], "table_uri": table_info["storage_location"]}
        self.v1_path = (f"{PREFIX}/delta/v1/catalogs/{table_info['catalog_name']}/schemas/"
                        f"{table_info['schema_name']}/tables/{table_info['name']}")

    def post(self, body: dict, key: str) -> httpx.Response:
        ci = body["commit_info"]
        if ci["version"] % 2:
            return self.http.post(PREFIX + "/delta/commit", json=body)
        commit = {"version": ci["version"], "timestamp": ci["timestamp"], "file-name": ci["file_name"],
                  "file-size": ci["file_size"], "file-modification-timestamp": ci["file_modification_timestamp"]}
        return self.http.post(self.v1_path, json={
            "requirements": [{"type": "assert-table-uuid", "uuid": self.q["table_id"]}],
            "updates": [{"action": "add-commit", "commit": commit},
                        {"action": "set-latest-backfilled-version",
                         "latest-published-version": body["latest_published_version"]}]})

    def prepare(self, cid: str) -> tuple[dict, int] | None:
        got = self.read(lambda: self.http.get(PREFIX + "/delta/commits", params=self.q))
        if got is None:
            return None
        latest = got["latest_table_version"]
        v = latest + 1
        return {**self.q, "commit_info": commit_info(v, f"{v:020d}.{cid}.json"),
                "latest_published_version": max(0, latest - DELTA_PUBLISH_LAG)}, v

    def part(self, body: dict) -> dict:
        return {"format": "delta", **body}


class UniformWriter(DeltaWriter):
    """A Delta writer on the UniForm table: each commit adds a real data file named after its id, in a real staged
    commit, and what it reports published it first publishes (backfills) to `_delta_log/<v>.json`, as Delta's UC
    client does: the service's conversion reads them."""

    def prepare(self, cid: str) -> tuple[dict, int] | None:
        got = self.read(lambda: self.http.get(PREFIX + "/delta/commits", params=self.q))
        if got is None:
            return None
        latest = got["latest_table_version"]
        location = self.q["table_uri"]
        for c in got["commits"]:
            if c["version"] <= latest - DELTA_PUBLISH_LAG:
                staged = CLIENT_FILES.read(f"{object_path(location)}/_delta_log/_staged_commits/{c['file_name']}")
                CLIENT_FILES.write_log(location, f"{c['version']:020d}.json", staged)
        name, data, add = chaos_uniform.data_file(cid)
        CLIENT_FILES.put(location, name, data)
        v = latest + 1
        staged = chaos_uniform.staged_commit(add)
        info = {**commit_info(v, f"{v:020d}.{cid}.json"), "file_size": len(staged)}
        CLIENT_FILES.put(location, f"_delta_log/_staged_commits/{info['file_name']}", staged)
        return {**self.q, "commit_info": info, "latest_published_version": max(0, latest - DELTA_PUBLISH_LAG)}, v


class LanceWriter(Writer):
    """Stages a manifest holding the commit id, as Lance writers do, and asks for version latest + 1. A retry with
    the same staged path is answered again if it landed; a refused commit's staged manifest is the writer's to
    remove."""

    fmt = "lance"

    def __init__(self, *args, location: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.location = location
        self.path = f"/v1/table/{LANCE_NS}${self.table}"

    def prepare(self, cid: str) -> tuple[dict, int] | None:
        got = self.read(lambda: self.http.post(self.path + "/version/list",
                                               params={"limit": 1, "descending": "true"}))
        if got is None:
            return None
        v = got["versions"][0]["version"] + 1 if got["versions"] else 1
        self.staged, self.staged_bytes = CLIENT_FILES.stage(self.location, v, _manifest(cid)), _manifest(cid)
        return {"version": v, "manifest_path": self.staged, "metadata": {"chaos-id": cid}}, v

    def post(self, body: dict, key: str) -> httpx.Response:
        self.restage()
        return self.http.post(self.path + "/version/create", json=body)

    def restage(self) -> None:
        """A power loss empties a staged manifest its writer never synced (Lance's local writer does not) unless
        the service already made it durable: the writer writes it again before a retry, as it would re-upload."""
        staged = Path("/" + self.staged)
        with contextlib.suppress(FileNotFoundError):
            if staged.stat().st_size != len(self.staged_bytes):
                staged.write_bytes(self.staged_bytes)

    def part(self, body: dict) -> dict:
        return {"format": "lance", "id": [LANCE_NS, self.table], **body}

    def settle(self, status: str) -> None:
        if status == "rejected":
            CLIENT_FILES.remove(self.staged)


def single_format_writers(base: str, table: str, log: ClientLog, stop: threading.Event, give_up: threading.Event,
                          tables: "Tables", *, patient: bool, pause_s: float = 0.0) -> list[Writer]:
    """One writer per format on `table`."""
    args, kw = (base, table, log, stop, give_up), {"patient": patient, "pause_s": pause_s}
    return [IcebergWriter(*args, **kw), DeltaWriter(*args, table_info=tables.delta[table], **kw),
            LanceWriter(*args, location=tables.lance[table], **kw)]


class CrossFormatWriter(Writer):
    """Commits to the same-named table of every format at once (`POST /api/coordinator/v1/commit`), racing the
    single-format writers on those tables. All three parts apply or none: the checker's `torn` counts any that
    did not. A patient retry resends the same body with the same Idempotency-Key."""

    fmt = "across"

    def __init__(self, base: str, table: str, log: ClientLog, stop: threading.Event, give_up: threading.Event,
                 *, patient: bool, tables: "Tables"):
        super().__init__(base, table, log, stop, give_up, patient=patient)
        self.writers = single_format_writers(base, table, log, stop, give_up, tables, patient=patient)

    def run(self) -> None:
        try:
            super().run()
        finally:
            for w in self.writers:
                w.http.close()

    def commit_once(self) -> None:
        cid, prepared = uuid.uuid4().hex, []
        for w in self.writers:
            p = w.prepare(cid)
            if p is None:
                return
            prepared.append(p)
        body, key = {"parts": [w.part(b) for w, (b, _) in zip(self.writers, prepared)]}, uuid7()

        def attempt() -> httpx.Response:
            for w in self.writers:
                if isinstance(w, LanceWriter):
                    w.restage()
            return self.http.post(CROSS_FORMAT_COMMIT, json=body, headers={"Idempotency-Key": key})
        status, doubt = self.send(attempt)
        for w, (_, version) in zip(self.writers, prepared):
            self.log.record(Outcome(w.fmt, self.table, cid, status, version, doubt, across=True))
            w.settle(status)

    def prepare(self, cid: str) -> tuple[dict, int] | None:
        raise NotImplementedError   # commit_once does the three formats' work

    post = part = prepare


def _manifest(cid: str) -> bytes:
    # Enough of a manifest for the service (it checks Lance's trailing magic), and unique to the commit.
    return b"chaos manifest " + cid.encode() + b" LANC"


def _now_ms() -> int:
    return int(time.time() * 1000)


# -- set-up and reading the state back --------------------------------------------------------------------------


@dataclass
class Tables:
    delta: dict[str, dict]          # name -> TableInfo
    lance: dict[str, str]           # name -> location


def set_up(base: str, uniform: bool = False) -> Tables:
    with httpx.Client(base_url=base, timeout=30) as http:
        assert http.post("/v1/namespaces", json={"namespace": [ICEBERG_NS]}).status_code == 200
        for t in TABLES:
            # Every metadata file stays in the metadata-log, so its numbering can be checked for holes.
            r = http.post(f"/v1/namespaces/{ICEBERG_NS}/tables", json={
                "name": t, "schema": SCHEMA, "properties": {"write.metadata.previous-versions-max": "1000000"}})
            assert r.status_code == 200, r.text
        r = http.post(f"/v1/namespaces/{ICEBERG_NS}/tables", json={
            "name": chaos_rebase.TABLE, "schema": SCHEMA,
            "properties": {"write.metadata.previous-versions-max": "1000000", **chaos_rebase.PROPERTIES}})
        assert r.status_code == 200, r.text
        assert http.post(f"/v1/namespace/{LANCE_NS}/create", json={}).status_code == 200
        lance = {}
        for t in TABLES:
            r = http.post(f"/v1/table/{LANCE_NS}${t}/declare", json={})
            assert r.status_code == 200, r.text
            lance[t] = r.json()["location"]
    uc = UC(base)
    try:
        delta = {t: uc.create_managed(t, schema=DELTA_SCHEMA, write_log=CLIENT_FILES.write_log) for t in TABLES}
    finally:
        uc.http.close()
    if uniform:
        delta[chaos_uniform.TABLE] = chaos_uniform.create(base, DELTA_SCHEMA, CLIENT_FILES)
    return Tables(delta, lance)


def read_state(base: str, database_url: str, tables: Tables) -> list[TableState]:
    with httpx.Client(base_url=base, timeout=60) as http:
        return ([read_iceberg(http, t) for t in (*TABLES, chaos_rebase.TABLE)]
                + [read_delta(http, database_url, t, info) for t, info in tables.delta.items()]
                + [read_lance(http, t) for t in TABLES])


def check_uniform(base: str, states: list[TableState], s3: MotoS3 | None) -> str:
    """The UniForm table's Iceberg side against its Delta side as read back (its anomalies join the table's)."""
    state = next(s for s in states if s.fmt == "delta" and s.table == chaos_uniform.TABLE)
    s3_properties = None if s3 is None else {"s3.endpoint": s3.endpoint, "s3.access-key-id": s3.access_key_id,
                                             "s3.secret-access-key": s3.secret_access_key, "s3.region": s3.region}
    found = chaos_uniform.check_iceberg_side(base, DELTA_SCHEMA, state.entries, s3_properties)
    state.anomalies += found
    latest = max(v for v, _ in state.entries)
    return (f"UniForm table {chaos_uniform.TABLE}: Delta at version {latest}; its Iceberg side "
            + ("caught up, every snapshot holding exactly its versions' files" if not found else "WRONG"))


def read_iceberg(http: httpx.Client, table: str) -> TableState:
    r = http.get(f"/v1/namespaces/{ICEBERG_NS}/tables/{table}")
    assert r.status_code == 200, r.text
    md, anomalies = r.json()["metadata"], []
    snapshots = {s["snapshot-id"]: s for s in md["snapshots"]}
    chain: list[int] = []
    sid = md["refs"].get("main", {}).get("snapshot-id")
    while sid is not None:
        if sid not in snapshots:
            anomalies.append(f"main's ancestry names snapshot {sid}, which the table does not hold")
            break
        chain.append(sid)
        sid = snapshots[sid].get("parent-snapshot-id")
    chain.reverse()
    off_main = sorted(set(snapshots) - set(chain))
    if off_main:
        anomalies.append(f"{len(off_main)} snapshots are not ancestors of main, e.g. {snapshots[off_main[0]]}")
    sequence = [snapshots[s]["sequence-number"] for s in chain]
    if sequence != sorted(sequence):
        anomalies.append(f"sequence numbers along main are out of order: {_spans(sequence)}")
    if [e["snapshot-id"] for e in md["snapshot-log"]] != chain:
        anomalies.append("the snapshot-log is not main's ancestry")
    files = [e["metadata-file"] for e in md["metadata-log"]] + [r.json()["metadata-location"]]
    numbers = [int(f.rsplit("/", 1)[1].split("-", 1)[0]) for f in files]
    if numbers != list(range(len(numbers))):
        anomalies.append(f"metadata files are numbered {_spans(numbers)}")
    entries = [(s["sequence-number"], s["summary"].get("chaos-id")) for s in snapshots.values()]
    if table == chaos_rebase.TABLE:
        anomalies += chaos_rebase.check(chaos_rebase.AppendFiles(CLIENT_FILES), md)
    return TableState("iceberg", table, 1, entries, anomalies)


def read_delta(http: httpx.Client, database_url: str, table: str, info: dict) -> TableState:
    """Published commits are no longer served by GET commits (a Delta reader finds them in `_delta_log/`), so the
    commit log in the database is the service's one record of every ratified version; the tail GET commits serves,
    page by page, must agree with it, and its latest version must be the log's."""
    log, anomalies = commit_log(database_url, info["table_id"]), []
    entries: list[tuple[int, str | None]] = []
    for v, name in log.items():
        if name == FIRST:
            entries.append((v, None))
            continue
        prefix, cid, _ = name.split(".")
        if int(prefix) != v:
            anomalies.append(f"version {v} was ratified as {name}")
        entries.append((v, cid))
    q = {"table_id": info["table_id"], "table_uri": info["storage_location"]}
    served: list[dict] = []
    start, latest = 0, None
    while True:
        r = http.get(PREFIX + "/delta/commits", params={**q, "start_version": start})
        assert r.status_code == 200, r.text
        body = r.json()
        latest = body["latest_table_version"]
        if not body["commits"]:
            break
        served += body["commits"]
        start = body["commits"][-1]["version"] + 1
        if start > latest:
            break
    if latest != max(log, default=-1):
        anomalies.append(f"latest_table_version {latest}, but the commit log ends at {max(log, default=None)}")
    versions = [c["version"] for c in served]
    if served and versions != list(range(versions[0], latest + 1)):
        anomalies.append(f"GET commits serves versions {_spans(versions)}, not a tail ending at {latest}")
    differ = [c["version"] for c in served if log.get(c["version"]) != c["file_name"]]
    if differ:
        anomalies.append(f"GET commits and the commit log disagree on versions {differ[:5]}")
    return TableState("delta", table, 0, entries, anomalies)


def read_lance(http: httpx.Client, table: str) -> TableState:
    path, anomalies = f"/v1/table/{LANCE_NS}${table}", []
    versions: list[dict] = []
    token = None
    while True:
        params = {"limit": LANCE_PAGE_SIZE} | ({"page_token": token} if token else {})
        r = http.post(path + "/version/list", params=params)
        assert r.status_code == 200, r.text
        versions += r.json()["versions"]
        token = r.json().get("page_token")
        if not token:
            break
    entries: list[tuple[int, str | None]] = []
    for v in versions:
        cid = (v.get("metadata") or {}).get("chaos-id")
        manifest = CLIENT_FILES.read(v["manifest_path"])
        if manifest is None:
            anomalies.append(f"version {v['version']}'s manifest {v['manifest_path']} does not exist")
        elif cid is None or manifest != _manifest(cid):
            anomalies.append(f"version {v['version']}'s manifest is not commit {cid}'s")
        entries.append((v["version"], cid))
    r = http.post(path + "/describe", json={})
    assert r.status_code == 200, r.text
    on_disk = sorted(n[0] for n in (version_of_manifest_name(f) for f in
                                    CLIENT_FILES.versions_dir_names(r.json()["location"])) if n)
    if on_disk != [v["version"] for v in versions]:
        anomalies.append(f"final manifests on disk {_spans(on_disk)} are not the versions listed "
                         f"{_spans([v['version'] for v in versions])}")
    return TableState("lance", table, 1, entries, anomalies)


# -- a run -------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    cycles: int
    seconds: float
    figures: Figures
    errors: Counter
    stalled: list[str]          # cycles in which a format had no commit acknowledged
    outcomes: list[Outcome]
    states: list[TableState]
    crash_hits: Counter = field(default_factory=Counter)   # aimed crashes: how often each point killed the service
    crash_target: int = 0
    read_back: list[str] = field(default_factory=list)       # what a real client could not read after a cut
    feed: dict[tuple[str, str], list[int]] = field(default_factory=dict)   # the commit feed, read at the end
    uniform: list[str] = field(default_factory=list)   # the UniForm table's Iceberg side ahead of its Delta side


def run_chaos(database_url: str, workdir: Path, cycles: int, *, seed: int = 7, load_s: tuple[float, float] = (1.0, 3.0),
              progress: Callable[[str], None] = print, s3: MotoS3 | None = None, aimed: AimedCrashes | None = None,
              power: PowerLoss | None = None) -> Run:
    """`cycles` SIGKILLs at random moments; or, with `aimed`, as many self-kills at the crash points as it takes
    to hit each `aimed.target` times (`cycles` then bounds the restarts). With `power`, PostgreSQL and the
    warehouse are on LazyFS and each kill is a power loss (`PowerLoss.cut`), after which pyiceberg must load every
    Iceberg table with every commit acknowledged so far. `s3`: run on a warehouse in a fresh bucket of this S3
    server instead of a local one."""
    global CLIENT_FILES
    t0 = time.monotonic()
    rng = random.Random(seed)
    where: dict = {"warehouse": power.warehouse if power else None}
    CLIENT_FILES = ClientFiles()
    if s3 is not None:
        bucket = s3.bucket()
        where = dict(warehouse=f"s3://{bucket}/chaos", extra_args=s3.serve_args)
        CLIENT_FILES = ClientFiles(s3.store(bucket))
    server_env = {"COORDINATOR_DELTA_COMMITS_PAGE_SIZE": str(DELTA_PAGE_SIZE), **(s3.env if s3 is not None else {})}
    server = ServerProcess(database_url, workdir / "server", extra_env=dict(server_env), **where)
    read_back: list[str] = []
    uniform: list[str] = []
    base = server.start(START_TIMEOUT_S)
    log, stop, give_up = ClientLog(), threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    try:
        tables = set_up(base, uniform=power is None)
        writers: list[Writer] = []
        for w in range(WRITERS_PER_FORMAT):
            t, patient = TABLES[w % 3], w % 2 == 0
            writers += single_format_writers(base, t, log, stop, give_up, tables, patient=patient)
        writers += [CrossFormatWriter(base, CROSS_FORMAT_TABLE, log, stop, give_up, patient=w % 2 == 0,
                                      tables=tables) for w in range(CROSS_FORMAT_WRITERS)]
        writers += single_format_writers(base, CROSS_FORMAT_TABLE, log, stop, give_up, tables, patient=True,
                                         pause_s=CROSS_FORMAT_RIVAL_PAUSE_S)
        writers += [RebasingWriter(base, chaos_rebase.TABLE, log, stop, give_up, patient=patient)
                    for patient in (True, False)]
        if chaos_uniform.TABLE in tables.delta:
            writers += [UniformWriter(base, chaos_uniform.TABLE, log, stop, give_up, patient=patient,
                                      table_info=tables.delta[chaos_uniform.TABLE]) for patient in (True, False)]
        threads = [threading.Thread(target=w.run, name=f"{w.fmt}-{w.table}", daemon=True) for w in writers]
        for th in threads:
            th.start()
        stalled: list[str] = []
        before = log.acked()
        done = 0
        for cycle in range(1, cycles + 1):
            down = time.monotonic()
            if aimed is None:
                ran = rng.uniform(*load_s)
                time.sleep(ran)
                server.kill()
                down = time.monotonic()
                if power is not None:
                    power.cut()
                server.start(START_TIMEOUT_S)
                how = (f"load {ran:.1f}s, SIGKILL{' + power loss' if power else ''}, back up in "
                       f"{time.monotonic() - down:.1f}s")
                if power is not None:
                    found = iceberg_read_back(base, ICEBERG_NS, [*TABLES, chaos_rebase.TABLE],
                                              log.acked_ids("iceberg"))
                    read_back += [f"after cycle {cycle}: {p}" for p in found]
            else:
                points = aimed.missing()
                if not points:
                    break
                server.kill()   # (the first cycle's server runs unarmed; later ones are dead already)
                server.extra_env = {**server_env, **aimed.env(points)}
                start_armed(server)
                ran = wait_for_death(server, CRASH_WAIT_S)
                if server.proc.poll() is None:
                    progress(f"cycle {cycle}: no armed point ({', '.join(points)}) was hit in {CRASH_WAIT_S}s")
                    break
                how = (f"killed itself after {ran:.1f}s up (hits so far: "
                       + ", ".join(f"{p} {n}" for p, n in aimed.hits().items()) + ")")
            done = cycle
            if chaos_uniform.TABLE in tables.delta:
                uniform += [f"after cycle {cycle}: {p}" for p in
                            chaos_uniform.sample(base, DELTA_SCHEMA, tables.delta[chaos_uniform.TABLE])]
            now = log.acked()
            gained = {f: now[f] - before[f] for f in FORMATS}
            if aimed is None:   # (an aimed crash may come before a format's first commit)
                stalled += [f"cycle {cycle}: {f}" for f in FORMATS if gained[f] == 0]
            before = now
            progress(f"cycle {cycle}/{cycles}: acknowledged " + ", ".join(f"{f} +{gained[f]}" for f in FORMATS)
                     + f" (total {sum(now.values())}); {how}")
        if aimed is not None:
            server.kill()
            server.extra_env = dict(server_env)   # the last run unarmed: it must make progress and stay up
            server.start(START_TIMEOUT_S)
            before = log.acked()
        # Let every format commit against the restarted service (a liveness check, with room for a slow machine).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(log.acked()[f] == before[f] for f in FORMATS):
            time.sleep(0.1)
        time.sleep(0.5)
        stop.set()
        deadline = time.monotonic() + 30
        for th in threads:
            th.join(max(0.1, deadline - time.monotonic()))
        give_up.set()
        for th in threads:
            th.join(10)
        assert not any(th.is_alive() for th in threads), "a writer is stuck"
        after_last = {f: log.acked()[f] - before[f] for f in FORMATS}
        stalled += [f"after the last restart: {f}" for f in FORMATS if after_last[f] == 0]
        server.stop()                                     # a clean restart before reading the state back
        server.start(START_TIMEOUT_S)
        states = read_state(base, database_url, tables)
        with httpx.Client(base_url=base, timeout=60) as http:
            progress(chaos_rebase.summary(http.get(f"/v1/namespaces/{ICEBERG_NS}/tables/{chaos_rebase.TABLE}")
                                          .json()["metadata"]))
        if chaos_uniform.TABLE in tables.delta:
            progress(check_uniform(base, states, s3))
            if not any(o.table == chaos_uniform.TABLE and o.status == "acked" for o in log.outcomes):
                uniform.append(f"no commit to the UniForm table {chaos_uniform.TABLE} was acknowledged")
        figures = check(log.outcomes, states)
        return Run(done, time.monotonic() - t0, figures, log.errors, stalled, log.outcomes, states,
                   aimed.hits() if aimed else Counter(), aimed.target if aimed else 0, read_back, read_feed(base),
                   uniform)
    finally:
        stop.set()
        give_up.set()
        server.stop()


def figures_table(run: Run) -> str:
    f = run.figures
    rows: list[tuple[str, list]] = [
        ("commits acknowledged", [f.counts[x]["acked"] for x in FORMATS]),
        ("commits refused (4xx)", [f.counts[x]["rejected"] for x in FORMATS]),
        ("in doubt at some attempt", [f.counts[x]["in doubt"] for x in FORMATS]),
        ("unknown (writer gave up)", [f.counts[x]["unknown"] for x in FORMATS]),
        ("... of which landed", [f.counts[x]["unknown, landed"] for x in FORMATS]),
    ]
    for name in ("lost", "duplicated", "phantom", "non_contiguous", "inconsistent"):
        items = getattr(f, name)
        label = {"non_contiguous": "tables non-contiguous", "inconsistent": "inconsistent views",
                 "phantom": "phantom (refused, present)"}.get(name, name)
        rows.append((label, [sum(1 for i in items if i.startswith(x + " ")) for x in FORMATS]))
    kinds = sorted({k for _, k in run.errors})
    for kind in kinds:
        rows.append((f"errors: {kind}", [run.errors[x, kind] for x in FORMATS]))
    width = max(len(r[0]) for r in rows)
    lines = [f"cycles: {run.cycles}   wall time: {run.seconds:.0f}s   stalled: {', '.join(run.stalled) or 'none'}"]
    if run.crash_hits:
        lines.append("crash points hit: " + ", ".join(f"{p} {n}" for p, n in run.crash_hits.items()))
    lines += [f"| {'figure':<{width}} | " + " | ".join(f"{x:>7}" for x in FORMATS) + " |   total |",
              f"|{'-' * (width + 2)}|" + "|".join("-" * 9 for _ in FORMATS) + "|---------|"]
    for label, values in rows:
        lines.append(f"| {label:<{width}} | " + " | ".join(f"{v:>7}" for v in values) + f" | {sum(values):>7} |")
    lines.append(f"commit feed: {sum(map(len, run.feed.values()))} commits reported; against the tables: "
                 f"{len(check_feed(run.feed, run.states))} problems (missing, extra or out of order)")
    across = Counter(o.status for o in run.outcomes if o.across and o.fmt == FORMATS[0])
    errors = sum(n for (fmt, _), n in run.errors.items() if fmt == "across")
    lines.append(f"cross-format commits (one part per format, counted in the columns above too): "
                 f"{across['acked']} acknowledged, {across['rejected']} refused, {across['unknown']} unknown, "
                 f"{errors} failed attempts; torn (applied in some formats only): {len(f.torn)}")
    return "\n".join(lines)


# -- tests -------------------------------------------------------------------------------------------------------


def verdict(run: Run) -> list[str]:
    """Everything that fails a run, for the pytest tests and the script alike (empty: it passed)."""
    problems = [] if run.figures.clean else [run.figures.problems()]
    problems += [f"no {fmt} commit was acknowledged" for fmt in FORMATS if run.figures.counts[fmt]["acked"] == 0]
    after = [s for s in run.stalled if s.startswith("after")]
    if after:
        problems.append(f"no progress after the last restart: {after}")
    # Any other answer than a conflict or 503 (a 5xx above all) means a client or the service is broken, not a crash.
    odd = {k: n for k, n in run.errors.items() if k[1].isdigit() and k[1] not in ("409", "503")}
    if odd:
        problems.append(f"unexpected answers (format, status): count: {odd}")
    problems += run.read_back + run.uniform
    problems += check_feed(run.feed, run.states)
    short = {p: n for p, n in run.crash_hits.items() if n < run.crash_target}
    if short:
        problems.append(f"crash points hit fewer than {run.crash_target} times: {short}")
    # The checker sees the real state: remove one acknowledged commit from it and it must say so.
    victim = next((o for o in run.outcomes if o.status == "acked"), None)
    if victim is not None:
        states = [TableState(s.fmt, s.table, s.first, [(v, c) for v, c in s.entries if c != victim.cid],
                             s.anomalies) for s in run.states]
        if not [line for line in check(run.outcomes, states).lost if victim.cid in line]:
            problems.append(f"checker self-test: commit {victim.cid} removed from the state, not reported lost")
    # And the feed's checker: one reported version taken away must be missed.
    reported = next(((k, v) for k, v in run.feed.items() if v), None)
    if reported is not None and not check_feed({**run.feed, reported[0]: reported[1][1:]}, run.states):
        problems.append(f"checker self-test: a version removed from the feed of {reported[0]}, not reported")
    return problems


def test_sigkill_cycles_under_mixed_load_lose_and_duplicate_nothing(database_url, tmp_path):
    cycles = int(os.environ.get("COORDINATOR_CHAOS_CYCLES", "3"))
    check_chaos_run(run_chaos(database_url, tmp_path, cycles, progress=lambda line: print(line, flush=True)))


def test_sigkill_cycles_on_an_s3_warehouse_lose_and_duplicate_nothing(database_url, tmp_path):
    """The same checks with the warehouse in a bucket of a real S3 server: Iceberg metadata and Lance manifests
    are PUT there, and a kill may land between a PUT and its commit (a short run)."""
    with MotoS3(tmp_path / "moto.log") as s3:
        check_chaos_run(run_chaos(database_url, tmp_path, 2, s3=s3, progress=lambda line: print(line, flush=True)))


def check_chaos_run(run: Run) -> None:
    print(figures_table(run))
    assert not verdict(run), "\n".join(verdict(run))


def test_aimed_crash_points_lose_and_duplicate_nothing(database_url, tmp_path):
    """The service kills itself at each crash point of the commit path (`COORDINATOR_CHAOS_CRASH_HITS` times
    each, 2 by default; the script's --crash-points run asks 20)."""
    target = int(os.environ.get("COORDINATOR_CHAOS_CRASH_HITS", "2"))
    aimed = AimedCrashes(tmp_path, target)
    run = run_chaos(database_url, tmp_path, target * len(CRASH_POINTS) * 4, aimed=aimed,
                    progress=lambda line: print(line, flush=True))
    print(figures_table(run))
    assert not verdict(run), "\n".join(verdict(run))
    assert all(run.crash_hits[p] >= target for p in CRASH_POINTS), run.crash_hits


POWER_LOSS_CYCLES = int(os.environ.get("COORDINATOR_CHAOS_POWER_CYCLES", "2"))


@pytest.fixture(scope="module")
def lazyfs():
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


def power_loss_run(tmp_path: Path, cycles: int, *, durable_commits: bool = True, seed: int = 7) -> Run:
    """`cycles` power losses on a fresh LazyFS rig."""
    power = PowerLoss(durable_commits=durable_commits)
    try:
        run = run_chaos(power.dsn, tmp_path, cycles, seed=seed, power=power,
                        progress=lambda line: print(line, flush=True))
    finally:
        power.close()
    return run


def test_power_loss_cycles_lose_nothing_acknowledged(lazyfs, tmp_path):
    run = power_loss_run(tmp_path, POWER_LOSS_CYCLES)
    print(figures_table(run))
    assert not verdict(run), "\n".join(verdict(run))


def test_power_loss_mode_finds_the_losses_of_non_durable_commits(lazyfs, tmp_path):
    """The negative control: with PostgreSQL answering commits before they are on disk, the same run must report
    acknowledged commits lost, or the mode proves nothing."""
    run = power_loss_run(tmp_path, POWER_LOSS_CYCLES, durable_commits=False)
    print(figures_table(run))
    assert run.figures.lost or run.read_back, "no loss found with synchronous_commit=off"


def test_verdict_fails_a_run_with_a_5xx_or_no_progress_after_the_last_restart():
    outcomes = _delta_log(a="acked@1")
    states = [TableState("delta", "t", 0, [(0, None), (1, "a")])]
    counts_ok = check(outcomes, states)
    feed = {("delta", "t"): [1]}
    run = Run(1, 1.0, counts_ok, Counter(), [], outcomes, states, feed=feed)
    assert [p for p in verdict(run) if "no iceberg commit" in p]   # (only Delta committed here)
    for fmt in ("iceberg", "lance"):
        counts_ok.counts[fmt]["acked"] = 1
    assert not verdict(run)
    assert "500" in " ".join(verdict(Run(1, 1.0, counts_ok, Counter({("delta", "500"): 1}), [], outcomes, states,
                                         feed=feed)))
    assert "feed delta t" in " ".join(verdict(Run(1, 1.0, counts_ok, Counter(), [], outcomes, states)))
    stalled = Run(1, 1.0, counts_ok, Counter(), ["after the last restart: lance"], outcomes, states, feed=feed)
    assert "no progress after the last restart" in " ".join(verdict(stalled))
    short = Run(1, 1.0, counts_ok, Counter(), [], outcomes, states, Counter({"after-files": 1}), 20, feed=feed)
    assert "fewer than 20" in " ".join(verdict(short))


def _delta_log(**outcomes: str) -> list[Outcome]:
    """Outcomes on Delta table t: `a="acked@1"` is commit a, acknowledged at version 1."""
    out = []
    for cid, spec in outcomes.items():
        status, version = spec.split("@")
        out.append(Outcome("delta", "t", cid, status, int(version)))
    return out


def test_checker_flags_lost_duplicated_phantom_and_holes():
    log = _delta_log(a="acked@1", b="acked@2", c="rejected@2", d="unknown@3", e="unknown@3")
    whole = [(0, None), (1, "a"), (2, "b"), (3, "d")]
    ok = check(log, [TableState("delta", "t", 0, whole)])
    assert ok.clean and ok.counts["delta"]["acked"] == 2 and ok.counts["delta"]["unknown, landed"] == 1

    removed = check(log, [TableState("delta", "t", 0, [(0, None), (1, "a"), (3, "d")])])
    assert len(removed.lost) == 1 and "commit b acknowledged at version 2, absent" in removed.lost[0]
    assert removed.non_contiguous and not removed.duplicated

    moved = check(log, [TableState("delta", "t", 0, [(0, None), (1, "a"), (2, "d"), (3, "b")])])
    assert len(moved.lost) == 1 and "found at [3]" in moved.lost[0]

    twice = check(log, [TableState("delta", "t", 0, whole + [(4, "d")])])
    assert twice.duplicated == ["delta t: commit d at versions [3, 4]"] and not twice.lost

    refused = check(log, [TableState("delta", "t", 0, whole + [(4, "c")])])
    assert len(refused.phantom) == 1 and not refused.lost

    stray = check(log, [TableState("delta", "t", 0, whole + [(4, "zz")])])
    assert stray.inconsistent and not stray.lost

    # Another table's copy of a commit is not this table's commit.
    elsewhere = check(log, [TableState("delta", "t", 0, [(0, None), (1, "a")]),
                            TableState("delta", "u", 0, [(0, None), (1, "b")])])
    assert any("commit b" in line for line in elsewhere.lost)


def test_feed_checker_flags_missing_extra_and_reordered_versions():
    states = [TableState("delta", "t", 0, [(0, None), (1, "a"), (2, "b")])]
    assert check_feed({("delta", "t"): [1, 2]}, states) == []
    assert "versions 2 missing" in check_feed({("delta", "t"): [1]}, states)[0]
    assert "reported but not held" in check_feed({("delta", "t"): [1, 2, 2]}, states)[0]
    assert "out of order" in check_feed({("delta", "t"): [2, 1]}, states)[0]
    assert "not read back" in check_feed({("delta", "t"): [1, 2], ("lance", "u"): [1]}, states)[0]


def test_checker_flags_a_cross_format_commit_applied_in_some_formats_only():
    log = [Outcome(fmt, "t", "x", "unknown", 1, True, across=True) for fmt in ("iceberg", "lance")]
    both = check(log, [TableState("iceberg", "t", 1, [(1, "x")]), TableState("lance", "t", 1, [(1, "x")])])
    neither = check(log, [TableState("iceberg", "t", 1, []), TableState("lance", "t", 1, [])])
    assert both.clean and neither.clean
    torn = check(log, [TableState("iceberg", "t", 1, [(1, "x")]), TableState("lance", "t", 1, [])])
    assert torn.torn == ["cross-format commit x: present in ['iceberg'], absent from ['lance']"] and not torn.clean


# -- as a script ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.test_chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=20, help="kills (with --crash-points: at most this many)")
    parser.add_argument("--seed", type=int, default=7, help="seeds the load durations between kills")
    parser.add_argument("--s3", action="store_true", help="on an S3 warehouse (moto's S3 server, started here)")
    parser.add_argument("--crash-points", type=int, metavar="HITS", default=0,
                        help="instead of SIGKILLs from outside, let the service kill itself at each of its crash "
                             "points until each was hit HITS times (20 asks for --cycles 400 or so)")
    parser.add_argument("--power-loss", action="store_true",
                        help="PostgreSQL's data and the warehouse on LazyFS; each kill is a power loss")
    parser.add_argument("--non-durable", action="store_true",
                        help="with --power-loss: PostgreSQL with synchronous_commit=off, to see losses reported")
    args = parser.parse_args(argv)
    if args.power_loss:
        reason = skip_reason()
        if reason:
            print(f"cannot run --power-loss: {reason}")
            return 2
        with tempfile.TemporaryDirectory(prefix="coordinator-chaos-") as work:
            run = power_loss_run(Path(work), args.cycles, durable_commits=not args.non_durable, seed=args.seed)
    else:
        with throwaway_postgres() as dsn, tempfile.TemporaryDirectory(prefix="coordinator-chaos-") as work:
            aimed = AimedCrashes(Path(work), args.crash_points) if args.crash_points else None
            s3 = MotoS3(Path(work) / "moto.log").start() if args.s3 else None
            try:
                run = run_chaos(dsn, Path(work), args.cycles, seed=args.seed, s3=s3, aimed=aimed,
                                progress=lambda line: print(line, flush=True))
            finally:
                if s3 is not None:
                    s3.stop()
    print(figures_table(run))
    problems = verdict(run)
    if problems:
        print("FAILED:\n" + "\n".join(problems))
        return 1
    print("OK: every acknowledged commit present once, no duplicates, versions contiguous, no 5xx, "
          "progress after the last restart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
