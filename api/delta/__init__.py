"""Unity Catalog's API for Delta tables: its routes (`routes.py`, the blueprint `bp`) and its one error translation
(`errors.py`, `error_response`)."""

from .errors import error_code, error_response
from .routes import DIRECT, bp, cross_format_part

__all__ = ["DIRECT", "bp", "cross_format_part", "error_code", "error_response"]
