"""`coordinator` on the command line: version, help with defaults, and start-up failures as one line, exit 2."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from coordinator.config import Config

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "api.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def assert_one_clear_line(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr and "ExceptionGroup" not in result.stderr, result.stderr[-3000:]
    # Start-up logs (JSON lines) may come first; the error is the last line and the only one not JSON.
    plain = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert len(plain) == 1, result.stderr[-3000:]
    assert plain[0].startswith("coordinator: "), plain
    for fragment in fragments:
        assert fragment in plain[0], plain


def test_version_comes_from_package_metadata():
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"coordinator {metadata.version('table-commit-coordinator')}"


def test_serve_help_describes_and_shows_every_default():
    result = run_cli("serve", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps lines
    assert "Run the service" in text
    for option, field in [("--host", "host"), ("--port", "port"), ("--data-dir", "data_dir"),
                          ("--log-level", "log_level"), ("--workers", "workers"), ("--cluster-host", "cluster_host"),
                          ("--cluster-port", "cluster_port"), ("--insecure", "insecure")]:
        assert option in text
        assert f"COORDINATOR_{field.upper()}, default: {getattr(Config(), field)})" in text, field
    for field in ["database_url", "warehouse", "auth_file", "cluster_advertise"]:  # no value: said in words
        assert f"COORDINATOR_{field.upper()}, default: " in text, field


def test_port_in_use_is_one_line_and_exit_2(database_url, tmp_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_cli("serve", "--port", str(port), "--database-url", database_url,
                         "--data-dir", str(tmp_path), "--log-level", "warning")
    assert_one_clear_line(result, f"127.0.0.1:{port} is already in use", "--port")


def test_unreadable_auth_file_is_one_line_and_exit_2(tmp_path):
    # A directory cannot be read as a file even by root, for whom permission bits do not apply.
    unreadable = tmp_path / "auth.toml"
    unreadable.mkdir()
    result = run_cli("serve", "--auth-file", str(unreadable), "--data-dir", str(tmp_path))
    assert_one_clear_line(result, f"cannot read auth file {unreadable}", "permissions")
    if os.geteuid() != 0:
        no_permission = tmp_path / "secret.toml"
        no_permission.write_text("")
        no_permission.chmod(0)
        result = run_cli("serve", "--auth-file", str(no_permission), "--data-dir", str(tmp_path))
        assert_one_clear_line(result, f"cannot read auth file {no_permission}", "PermissionError")


def test_unreachable_database_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on: bound, never listening, so connections are refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        url = f"postgresql://coordinator:hunter2@127.0.0.1:{port}/coordinator"
        result = run_cli("serve", "--port", "0", "--database-url", url, "--data-dir", str(tmp_path),
                         env={"COORDINATOR_DB_TIMEOUT_S": "1"})
    assert_one_clear_line(result, f"cannot connect to PostgreSQL at postgresql://coordinator:***@127.0.0.1:{port}",
                          "--database-url")
    assert "hunter2" not in result.stderr


def test_the_feed_options_on_the_command_line_reach_the_service(monkeypatch, tmp_path):
    import api.cli
    import api.server
    served = []
    monkeypatch.setattr(api.server, "serve", served.append)
    monkeypatch.setattr(api.server, "configure_logging", lambda level: None)
    assert api.cli.main(["serve", "--data-dir", str(tmp_path), "--events-retention-s", "60", "--events-max", "5"]) == 0
    assert (served[0].events_retention_s, served[0].events_max) == (60.0, 5)
