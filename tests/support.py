"""Test helpers shared by the protocol suites: the service as a real OS process that can be SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import asyncpg
import httpx

from coordinator.keys import new_key
from storage.embedded import EmbeddedPostgres, free_port


@contextmanager
def throwaway_cluster() -> Iterator[EmbeddedPostgres]:
    """A started PostgreSQL cluster in a fresh temp dir on a free port for the duration of the block (for tests
    that stop, kill or restart it)."""
    root = Path(tempfile.mkdtemp(prefix="coordinator-test-pg-"))
    root.chmod(0o755)  # as root, PostgreSQL runs as another OS user that must reach its directory
    pg = EmbeddedPostgres(root / "pg")
    try:
        pg.start()
        yield pg
    finally:
        pg.destroy()
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A PostgreSQL cluster in a fresh temp dir on a free port for the duration of the block; yields its DSN."""
    with throwaway_cluster() as pg:
        yield pg.dsn


class ServerProcess:
    """`coordinator serve` in a subprocess on a fixed port, so a restart keeps the clients' URL. With no
    `database_url` it runs its own embedded PostgreSQL in `data_dir`, as `coordinator serve` does by default."""

    def __init__(self, database_url: str | None, data_dir: Path, *, warehouse: str | None = None,
                 extra_env: dict[str, str] | None = None, extra_args: list[str] | None = None,
                 log_level: str = "warning", descriptor_limit: int | None = None):
        self.log_level = log_level
        self.descriptor_limit = descriptor_limit   # the process's soft RLIMIT_NOFILE (None: inherited)
        self.database_url = database_url
        self.data_dir = Path(data_dir)
        self.warehouse = warehouse or str(self.data_dir / "warehouse")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.extra_env = extra_env or {}
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.log_path = self.data_dir / "server.log"

    def start(self, timeout_s: float = 30.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.extra_env}
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "serve", "--port", str(self.port),
             *(["--database-url", self.database_url] if self.database_url else []),
             "--data-dir", str(self.data_dir), "--warehouse", self.warehouse,
             "--log-level", self.log_level, *self.extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[1],
            preexec_fn=None if self.descriptor_limit is None else self._limit_descriptors)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log_path}:\n"
                                   + self.log_path.read_text()[-3000:])
            try:
                if httpx.get(self.base_url + "/readyz", timeout=1).status_code == 200:
                    return self.base_url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become ready in {timeout_s}s; see {self.log_path}")

    def _limit_descriptors(self) -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.descriptor_limit, hard))

    def kill(self) -> None:
        """SIGKILL: no clean-up, no flush, exactly like a crash."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "ServerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def sql(dsn: str, query: str, *args):
    """Rows of one query, for a synchronous test (asyncpg on an event loop of its own)."""
    async def run():
        con = await asyncpg.connect(dsn)
        try:
            return await con.fetch(query, *args)
        finally:
            await con.close()
    return asyncio.run(run())


uuid7 = new_key  # a UUIDv7 string, as Iceberg's Idempotency-Key requires


# -- authentication: an auth file for tests, and tokens from the service's own token endpoint ---------------------


def write_auth_file(path: Path, clients: dict[str, tuple[str, list[tuple[str, list[str]] | dict]]],
                    token_ttl_s: int = 3600, **settings) -> Path:
    """`clients`: id -> (secret, grants), each grant `(on, privileges)` (a container's) or a dict as the file
    spells it (`{"table": path, "privileges": [...]}`); each client gets a role of its own. `settings` are more
    top-level keys (`token_exchange_max_s`)."""
    from coordinator.auth import hash_secret
    lines = [f"token_ttl_s = {token_ttl_s}", *(f"{k} = {json.dumps(v)}" for k, v in settings.items())]
    for cid, (secret, grants) in clients.items():
        lines += ["[[clients]]", f'id = "{cid}"', f'secret = "{hash_secret(secret)}"', f'roles = ["{cid}"]']
    for cid, (_, grants) in clients.items():
        specs = [g if isinstance(g, dict) else {"on": g[0], "privileges": g[1]} for g in grants]
        body = ", ".join("{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in spec.items()) + " }" for spec in specs)
        lines += [f"[roles.{cid}]", f"grants = [{body}]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def commits_in(http: httpx.Client, path: str, seconds: float) -> int:
    """How many commits a writer makes to Iceberg table `path`, one after another, in `seconds` (each must be
    answered 200)."""
    commits, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = http.post(path, json={"requirements": [], "updates": [
            {"action": "set-properties", "updates": {"commit": str(commits)}}]})
        assert r.status_code == 200, r.text
        commits += 1
    return commits


def fetch_token(base_url: str, client_id: str, secret: str) -> str:
    r = httpx.post(f"{base_url}/v1/oauth/tokens", data={"grant_type": "client_credentials", "client_id": client_id,
                                                        "client_secret": secret, "scope": "catalog"}, timeout=30)
    r.raise_for_status()
    return r.json()["access_token"]


@contextmanager
def iceberg_table_client(base_url: str, schema: dict) -> Iterator[httpx.Client]:
    """An HTTP client of the service, with Iceberg namespace `db` and table `db.t` (of `schema`) created."""
    with httpx.Client(base_url=base_url, timeout=30) as client:
        assert client.post("/v1/namespaces", json={"namespace": ["db"]}).status_code == 200
        assert client.post("/v1/namespaces/db/tables", json={"name": "t", "schema": schema}).status_code == 200
        yield client


# -- a real S3 server on loopback ---------------------------------------------------------------------------------


class MotoS3:
    """moto's standalone S3 server (`moto.server`, speaks S3 over HTTP, conditional writes included) in a
    subprocess on a free loopback port. `bucket()` makes a fresh bucket; `options` are obstore's settings for it
    and `env` the AWS_* variables a client or the service reads its credentials from."""

    region = "us-east-1"
    access_key_id = "testing"
    secret_access_key = "testing"

    def __init__(self, log_path: Path | None = None):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60.0) -> "MotoS3":
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto's S3 server exited with {self.proc.returncode}: is moto[server] installed "
                                   f"(pip install -e '.[test]')?")
            try:
                if httpx.get(self.endpoint + "/moto-api/", timeout=1).status_code < 500:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"moto's S3 server did not answer on {self.endpoint} in {timeout_s}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "MotoS3":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh name unless given) and return its name."""
        name = name or f"b-{uuid7()[-12:]}"
        r = httpx.put(f"{self.endpoint}/{name}", timeout=30)
        assert r.status_code == 200, r.text
        return name

    @property
    def options(self) -> dict[str, str]:
        """obstore S3Store settings for this server: path-style over plain HTTP, with its keys."""
        return {"endpoint": self.endpoint, "allow_http": "true", "virtual_hosted_style_request": "false",
                "region": self.region, "access_key_id": self.access_key_id,
                "secret_access_key": self.secret_access_key}

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
                "AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region}

    @property
    def serve_args(self) -> list[str]:
        """`coordinator serve` flags that point the service at this server (credentials: `env`)."""
        return ["--s3-endpoint", self.endpoint, "--s3-region", self.region, "--s3-path-style"]

    def store(self, bucket: str):
        from obstore.store import S3Store
        return S3Store(bucket, **self.options)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key in `bucket` under `prefix`, sorted."""
        import obstore
        return sorted(meta["path"] for chunk in obstore.list(self.store(bucket), prefix=prefix or None)
                      for meta in chunk)
