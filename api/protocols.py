"""The protocols this service speaks, one for each format it serves (coordinator/formats.py lists those): the one
place in `api/` that names them. api/app.py builds the app from this list."""

from __future__ import annotations

from .delta import DELTA
from .iceberg import ICEBERG
from .lance import LANCE
from .protocol import Protocols

PROTOCOLS = Protocols((ICEBERG, DELTA, LANCE))
