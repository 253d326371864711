"""The Lance Namespace REST protocol: its routes (`routes.py`, the blueprint `bp`), its one error translation
(`errors.py`, `error_response`) and its declaration (`protocol.py`, `LANCE`)."""

from .errors import ERRORS, error_response
from .protocol import LANCE

__all__ = ["ERRORS", "LANCE", "error_response"]
