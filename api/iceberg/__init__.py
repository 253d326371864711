"""The Iceberg REST Catalog protocol: its routes (`routes.py`, the blueprint `bp`), its Idempotency-Key handling
(`idempotency.py`), its one error translation (`errors.py`, `error_response`) and its declaration (`protocol.py`,
`ICEBERG`); and the same read routes over Unity Catalog's Delta tables (`uniform.py`, the blueprint `uniform.bp`)."""

from .errors import ERRORS, error_response
from .protocol import ICEBERG

__all__ = ["ERRORS", "ICEBERG", "error_response"]
