"""The stage breakdown (loadtest/stages.py): a sample goes to the stage of its innermost frame a rule names, and the
threads' measured CPU is shared out so that the stages add up to it."""

from __future__ import annotations

import pytest

from loadtest import stages

LOOP = "<module> (api/cli.py:108);serve (api/server.py:133);run (trio/_core/_run.py:2532);unrolled_run (trio/_core/_run.py:2866)"
RAW = f"""\
thread (100): MainThread;{LOOP};H11Protocol.handle (hypercorn/protocol/h11.py:116) 30
thread (100): MainThread;{LOOP};TableActor.run (coordinator/actor.py:208);CancelScope.__enter__ (trio/_core/_run.py:627) 10
thread (100): MainThread;{LOOP} 10
thread (100): MainThread;{LOOP};commit_table (api/iceberg/routes.py:357);json_response (api/common.py:50);Response.__init__ (quart/wrappers/response.py:1);Headers.__init__ (werkzeug/datastructures/headers.py:1) 5
thread (101): storage-asyncio;Thread._bootstrap (threading.py:1002);AsyncioThread.start.<locals>.main (storage/bridge.py:39) 5
thread (102): Trio thread 0;Thread._bootstrap (threading.py:1002);WorkerThread._work (trio/_core/_thread_cache.py:213);write_durably (storage/localfs.py:80) 5
"""


@pytest.mark.parametrize("function, filename, stage", [
    ("H11Protocol.handle", "hypercorn/protocol/h11.py", stages.HTTP),
    ("Quart.full_dispatch_request", "quart/app.py", stages.QUART),
    ("Quart.create_url_adapter", "quart/app.py", stages.ROUTING),          # a function's rule before its file's
    ("json_response", "api/common.py", stages.ANSWER),
    ("parse_json", "api/common.py", stages.BODY),
    ("create_app.<locals>._finish", "api/app.py", stages.LOGGING),
    ("GroupCommitWriter._flush", "storage/writer.py", stages.DB),
    ("CommitTable.decide", "coordinator/iceberg/proposals.py", stages.ACTOR),  # a directory's rule
    ("Response.__init__", "quart/wrappers/response.py", None),               # transparent: charged to its caller
    ("join", "storage/paths.py", None),
])
def test_a_frame_gets_the_most_specific_rule(function, filename, stage):
    assert stages.frame_stage(function, filename) == (True, stage)


def test_a_sample_goes_to_its_innermost_named_frame(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    samples = stages.Samples.read(raw)
    assert samples.names == {100: "MainThread", 101: "storage-asyncio", 102: "Trio thread 0"}
    assert samples.stages[100] == {stages.HTTP: 30, stages.ACTOR: 10, stages.LOOP: 10, stages.ANSWER: 5}
    assert samples.stages[101] == {stages.DB: 5}
    assert samples.stages[102] == {stages.FILES: 5}


def test_the_stages_add_up_to_the_measured_cpu(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    before = {0: (10.0, 5.0), 100: (8.0, 4.0), 101: (1.0, 0.5), 102: (0.5, 0.25)}
    # process: 1.5 s more; threads: main 0.5 user + 0.2 system, asyncpg 0.3, worker 0.3, one ended thread 0.2
    after = {0: (11.0, 5.5), 100: (8.5, 4.2), 101: (1.2, 0.6), 102: (0.6, 0.45)}
    b = stages.breakdown(stages.Samples.read(raw), before, after, pid=100, operations=100)
    assert b.total_ms == pytest.approx(15.0)                                   # 1.5 s over 100 commits
    assert b.ms[stages.KERNEL] == pytest.approx(2.0)                           # the event loop's system time
    assert b.ms[stages.HTTP] == pytest.approx(5.0 * 30 / 55)                   # its user time, by its samples
    assert b.ms[stages.DB] == pytest.approx(3.0)
    assert b.ms[stages.FILES] == pytest.approx(3.0 + 2.0)                      # the worker, and the ended thread
    assert {name: pytest.approx(cpu) for name, cpu in b.threads.items()} == {   # by kind of thread, user + system
        "MainThread": (5.0, 2.0), "storage-asyncio": (2.0, 1.0), "Trio thread": (1.0, 2.0),
        "(threads that ended)": (2.0, 0.0)}
    assert "| Trio thread | 1.000 + 2.000 |" in stages.thread_table({"service": b})


def test_the_table_shows_every_stage_with_cpu_and_the_total(tmp_path):
    raw = tmp_path / "raw.txt"
    raw.write_text(RAW)
    b = stages.breakdown(stages.Samples.read(raw), {0: (0.0, 0.0)}, {0: (1.0, 0.0), 100: (1.0, 0.0)}, pid=100,
                         operations=1000)
    text = stages.table({"service": b})
    assert f"| {stages.HTTP} | 0.545 (55%) |" in text
    assert "| **total** | **1.000** |" in text
    assert stages.DB not in text   # no CPU there
