"""What the coordinator's parts are built from: every shared part, made once when the coordinator opens.

A format's service (`Format.service`), the warehouses, UniForm and the cluster each take a `Services`, complete
when they are built: nothing is filled in later, and nothing else reaches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # (types only: this module stays importable from every part it describes)
    from storage.files import FileIO
    from storage.postgres import PostgresStore

    from .auth import AuthConfig
    from .config import Config
    from .feed import Feed
    from .format import Formats
    from .idempotency import Idempotency
    from .metrics import Metrics
    from .registry import Registry
    from .warehouses import Warehouses


@dataclass(frozen=True)
class Services:
    config: Config
    formats: Formats            # the formats served (coordinator/formats.py)
    store: PostgresStore
    files: FileIO
    metrics: Metrics
    registry: Registry
    feed: Feed
    idempotency: Idempotency
    warehouses: Warehouses
    auth: AuthConfig | None     # None: authentication is off, every request is anonymous and allowed
