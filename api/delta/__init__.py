"""Unity Catalog's API for Delta tables: its routes (`routes.py`, the blueprint `bp`), its one error translation
(`errors.py`, `error_response`) and its declaration (`protocol.py`, `DELTA`)."""

from .errors import ERRORS, error_response
from .protocol import DELTA

__all__ = ["DELTA", "ERRORS", "error_response"]
