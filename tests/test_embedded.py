"""The embedded PostgreSQL as root: when it cannot run as another OS user, it says so and what to do, and a stop
that cannot tell whether the server runs says so instead of leaving it running in silence."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from storage.embedded import EmbeddedPostgres, EmbeddedPostgresError

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="as another user PostgreSQL runs as that user")


@pytest.fixture
def root():
    path = Path(tempfile.mkdtemp(prefix="coordinator-embedded-"))
    path.chmod(0o755)  # the postgres OS user must reach it
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_an_os_user_that_cannot_be_made_is_a_clear_error(root, monkeypatch):
    monkeypatch.setenv("COORDINATOR_PG_OS_USER", "no such user!")   # useradd refuses the name
    with pytest.raises(EmbeddedPostgresError) as err:
        EmbeddedPostgres(root / "pg")
    message = str(err.value)
    assert "'no such user!'" in message and "COORDINATOR_PG_OS_USER" in message and "--database-url" in message
    assert not (root / "pg").exists()


def test_a_stop_that_cannot_check_the_server_says_so(root, caplog):
    pg = EmbeddedPostgres(root / "pg")
    pg.start()
    user = pg.user
    try:
        pg.user = "coordinator-no-such-user"   # runuser fails, as it did when /etc/passwd went missing
        with caplog.at_level(logging.WARNING, logger="storage.embedded"):
            pg.stop()
        assert any("could not tell whether the embedded PostgreSQL" in r.getMessage() and "pg_ctl stop" in
                   r.getMessage() for r in caplog.records), caplog.text
        pg.user = user
        assert pg.is_running()
        pg.stop()
        assert not pg.is_running()
        pg.stop()   # stopping a stopped cluster is quiet
    finally:
        pg.user = user
        pg.destroy()
