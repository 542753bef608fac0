"""The one backend registry: name -> :class:`~fastvideo_cute.backends.base.Backend`."""

from __future__ import annotations

from typing import Dict, List, Tuple

from .base import Backend

__all__ = ["register", "get", "names", "supported_head_dims", "REGISTRY"]

REGISTRY: Dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    if not isinstance(backend, Backend):
        raise TypeError(f"{backend!r} does not implement the Backend protocol (fastvideo_cute.backends.base)")
    REGISTRY[backend.name] = backend
    return backend


def get(name: str) -> Backend:
    return REGISTRY[name]


def names() -> List[str]:
    return sorted(REGISTRY)


def supported_head_dims() -> Tuple[int, ...]:
    """The head dims some registered backend serves (on some GPU), ascending."""
    return tuple(sorted({d for backend in REGISTRY.values() for d in backend.head_dims}))
