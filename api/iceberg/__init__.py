"""The Iceberg REST Catalog protocol: its routes (`routes.py`, the blueprint `bp`), its Idempotency-Key handling
(`idempotency.py`) and its one error translation (`errors.py`, `error_response`); and the same read routes over
Unity Catalog's Delta tables (`uniform.py`, the blueprint `uniform.bp`)."""

from . import uniform
from .errors import error_response
from .routes import DIRECT, bp, cross_format_part

__all__ = ["DIRECT", "bp", "cross_format_part", "error_response", "uniform"]
