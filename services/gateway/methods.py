"""The methods a path takes: those of every route serving it (a 405's Allow)."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import Scope

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def methods_taken(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """The methods of ``METHODS`` some route of ``routes`` serves at the path of ``scope`` (Starlette's
    405 names the methods of the first route matching the path: /health's GET, not its HEAD twin's)."""
    return [
        method
        for method in METHODS
        if any(route.matches({**scope, "method": method})[0] == Match.FULL for route in routes)
    ]
