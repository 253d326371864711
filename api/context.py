"""How the code serving a request reaches the coordinator behind the app it runs in (api/app.py `create_app`), and
a format's service there."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from quart import current_app

from coordinator.format import Format

if TYPE_CHECKING:
    from coordinator.service import Coordinator

S = TypeVar("S")


def current_coordinator() -> Coordinator:
    """The coordinator behind the app serving the current request."""
    return current_app.config["COORDINATOR"]


def service(fmt: Format[S]) -> S:
    """The service of format `fmt`, in the app serving the current request."""
    return current_coordinator().service(fmt)
