"""The cluster channel's secret: what a member must hold for the others to speak to it (channel.py's handshake).

It is a secret of its own, kept in a file that only the service's OS user can read, never anything the database
holds: a process that can read the database (a reader of a backup, a role granted SELECT) cannot pass for a member.
Members on one host that share a data dir share its `cluster.key`, made on first use; members on several hosts are
each given one secret file (`cluster_secret_file`), which is then required: a key made on each host would differ,
and their members would refuse each other.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from ..config import Config, ConfigError, is_loopback

DEFAULT_FILE = "cluster.key"   # in the data dir
MIN_CHARS = 32
GENERATE = "openssl rand -hex 32 > cluster.secret && chmod 600 cluster.secret"


def channel_key(config: Config) -> bytes:
    """The channel's HMAC key, from `cluster_secret_file`, or else the data dir's `cluster.key` (made if absent)."""
    path = config.cluster_secret_file
    if path is None:
        reached_at = config.cluster_advertise.rpartition(":")[0] if config.cluster_advertise else config.cluster_host
        if not is_loopback(reached_at):
            raise ConfigError(
                f"members reached at {reached_at} (not loopback) may run on several hosts, which cannot share a data "
                f"dir's cluster key: give every member the same secret file with --cluster-secret-file (env "
                f"COORDINATOR_CLUSTER_SECRET_FILE); make one with `{GENERATE}` and copy it to each host")
        path = Path(config.data_dir) / DEFAULT_FILE
        make_secret_file(path)
    return hmac.new(_read_private(Path(path)), b"cluster-channel", hashlib.sha256).digest()


def make_secret_file(path: Path) -> Path:
    """A fresh random secret at `path` (0600), unless one is there: of members starting at once, the first one's
    stays."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_hex(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(staged, path)   # never replaces a secret another member made meanwhile
    except FileExistsError:
        pass
    finally:
        os.unlink(staged)
    return path


def _read_private(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
        secret = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the cluster secret file {path} ({exc.strerror or exc}): check the path "
                          f"(--cluster-secret-file) and that this OS user may read it") from None
    if not stat.S_ISREG(mode):
        raise ConfigError(f"the cluster secret file {path} is not a regular file")
    if mode & 0o007:
        raise ConfigError(f"the cluster secret file {path} may be read or written by other OS users "
                          f"(mode {stat.filemode(mode)}): `chmod 600 {path}`")
    if len(secret) < MIN_CHARS:
        raise ConfigError(f"the cluster secret in {path} is shorter than {MIN_CHARS} characters: make a new one "
                          f"with `{GENERATE}` and give it to every member")
    return secret
