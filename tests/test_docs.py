"""The documentation's examples run, so they cannot rot.

The convention, for README.md and every docs/*.md (files added later are found the same way):

- A fenced block labelled ```python or ```sh is run. ```python spark / ```sh spark blocks are run only by the
  `spark` test (they need PySpark and the Iceberg runtime jars from tests/spark/build_runtime.sh); ```python
  dagster blocks only by the `dagster` test (the `dagster` extra; CI installs it, and there it must run).
- A block that must not run (it installs something, starts a server, needs a systemd host) says so:
  ```sh no-run. Output, configuration and other languages are labelled ```text, ```toml, ```ini, ```json ...
  and are not run. An unlabelled block, or one labelled bash/shell/py, is an error: say which you mean.
- The blocks of one file run in order, in one environment: python blocks share one namespace, every block runs in
  one working directory of its own (a temp dir), against one service this test starts. The docs write the
  service's address as http://127.0.0.1:8181 (`coordinator serve` defaults); the test puts its own URL there.

`python -m pytest -v tests/test_docs.py` lists each block it ran by file:line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import TEMPLATE, _psql, _with_db
from tests.support import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
DOC_URL = "http://127.0.0.1:8181"
RUN_LANGUAGES = {"python", "sh"}
AMBIGUOUS = {"bash", "shell", "py", "python3", "console-run"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int            # line of the opening fence, 1-based
    language: str
    flags: tuple[str, ...]
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN_LANGUAGES and "no-run" not in self.flags

    @property
    def needs_spark(self) -> bool:
        return "spark" in self.flags

    @property
    def needs_dagster(self) -> bool:
        return "dagster" in self.flags


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    blocks, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        words = opening["info"].strip().split()
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(opening["fence"]):
            body.append(lines[j][len(opening["indent"]):])
            j += 1
        blocks.append(Block(path, i + 1, words[0] if words else "", tuple(words[1:]), "\n".join(body) + "\n"))
        i = j + 1
    return blocks


ALL_BLOCKS = [block for path in doc_files() for block in blocks_of(path)]
RUN_BLOCKS = [block for block in ALL_BLOCKS if block.runs and not block.needs_spark and not block.needs_dagster]
SPARK_BLOCKS = [block for block in ALL_BLOCKS if block.runs and block.needs_spark]
DAGSTER_BLOCKS = [block for block in ALL_BLOCKS if block.runs and block.needs_dagster]


def test_every_block_says_whether_it_runs():
    unclear = [f"{b.id}: {'no label' if not b.language else b.language}" for b in ALL_BLOCKS
               if not b.language or b.language in AMBIGUOUS]
    assert not unclear, ("label each fenced block: python or sh (run by tests/test_docs.py), sh no-run, or "
                         "text/toml/ini/json/...: " + "; ".join(unclear))


@pytest.fixture(scope="module")
def service_url(pg_admin_dsn, tmp_path_factory):
    """One `coordinator serve` for all the docs, on its own database and data directory."""
    name = "docs_" + os.urandom(6).hex()
    _psql(pg_admin_dsn, f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
    server = ServerProcess(_with_db(pg_admin_dsn, name), tmp_path_factory.mktemp("docs-service"))
    try:
        yield server.start(timeout_s=120)
    finally:
        server.stop()
        _psql(pg_admin_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class DocEnvironment:
    """What the blocks of one file share: a working directory and a Python namespace."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.namespace: dict = {"__name__": "__docs__"}


@pytest.fixture(scope="module")
def environments(tmp_path_factory):
    made: dict[Path, DocEnvironment] = {}

    def for_file(path: Path) -> DocEnvironment:
        if path not in made:
            made[path] = DocEnvironment(tmp_path_factory.mktemp("docs-" + path.stem))
        return made[path]
    return for_file


def run_block(block: Block, url: str, env: DocEnvironment) -> None:
    code = block.code.replace(DOC_URL, url)
    if block.language == "sh":
        bin_dir = str(Path(sys.executable).parent)
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=env.workdir, capture_output=True,
                                text=True, timeout=300,
                                env={**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]})
        assert result.returncode == 0, (f"{block.id} exited {result.returncode}\n--- block ---\n{code}"
                                        f"--- stdout ---\n{result.stdout[-3000:]}\n--- stderr ---\n"
                                        f"{result.stderr[-3000:]}")
        return
    cwd = os.getcwd()
    os.chdir(env.workdir)
    try:
        exec(compile(code, block.id, "exec"), env.namespace)
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=[b.id for b in RUN_BLOCKS])
def test_doc_block_runs(block, service_url, environments):
    run_block(block, service_url, environments(block.path))


@pytest.mark.spark
@pytest.mark.parametrize("block", SPARK_BLOCKS, ids=[b.id for b in SPARK_BLOCKS])
def test_doc_spark_block_runs(block, service_url, environments):
    pytest.importorskip("pyspark")
    run_block(block, service_url, environments(block.path))


@pytest.mark.parametrize("block", DAGSTER_BLOCKS, ids=[b.id for b in DAGSTER_BLOCKS])
def test_doc_dagster_block_runs(block, service_url, environments):
    """The Dagster sensor of docs/events.md, with Dagster itself: `pip install -e '.[test,dagster]'`; CI does."""
    if not os.environ.get("CI"):
        pytest.importorskip("dagster")
    run_block(block, service_url, environments(block.path))


def test_the_convention_is_followed_by_the_parser(tmp_path):
    """The parser itself: labels, flags, order and line numbers as the convention above says."""
    doc = tmp_path / "x.md"
    doc.write_text("text\n```python\nx = 1\n```\n```sh no-run\npip install x\n```\n```text\nout\n```\n"
                   "```python spark\ns = 1\n```\n")
    found = blocks_of(doc)
    assert [(b.line, b.language, b.flags) for b in found] == [
        (2, "python", ()), (5, "sh", ("no-run",)), (8, "text", ()), (11, "python", ("spark",))]
    assert [b.runs for b in found] == [True, False, False, True]
    assert found[0].code == "x = 1\n"
