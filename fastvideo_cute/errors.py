"""The library's exception types (a leaf module)."""

from __future__ import annotations

__all__ = ["RouteError", "EnvError"]


class RouteError(RuntimeError):
    """No backend can serve the call as asked (a forced backend that cannot serve it, or no route
    at all); the message says why."""


class EnvError(RouteError, ValueError):
    """An environment variable holds a value the library does not understand, or two variables
    ask for different routes."""
