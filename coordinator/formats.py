"""The formats this service serves: the one place that names them (coordinator/format.py says what each declares;
api/protocols.py lists their protocols likewise). A format added to the service is added here."""

from __future__ import annotations

from .delta.format import DELTA
from .format import Formats
from .iceberg.format import ICEBERG
from .lance.format import LANCE

FORMATS = Formats((ICEBERG, DELTA, LANCE))
