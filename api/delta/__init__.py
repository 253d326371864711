"""Unity Catalog's API for Delta tables: its routes (`routes.py`, the blueprint `bp`) and its one error translation
(`errors.py`, `error_response`)."""

from .errors import ERRORS, error_response
from .routes import DIRECT, bp, cross_format_part

__all__ = ["DIRECT", "ERRORS", "bp", "cross_format_part", "error_response"]
