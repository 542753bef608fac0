"""Backends behind the routes. Each module exposes ``support(info) -> (ok, reason)``,
``forward(...)`` and ``backward(...)`` with the signatures of :mod:`.triton_backend`, and is
registered with :mod:`fastvideo_cute.routes` here. CuTe/FA4 code is imported only inside
those functions, so importing this package never imports the CuTe DSL."""

from __future__ import annotations

from typing import Dict

from ..routes import Route, register_route
from . import fa4_backend, sm100_backend, sm120_backend, triton_backend

BACKENDS: Dict[str, object] = {"triton": triton_backend, "fa4": fa4_backend, "sm120": sm120_backend,
                               "sm100": sm100_backend}
register_route(Route("triton", "triton", triton_backend.support))
register_route(Route("fa4", "cute", fa4_backend.support))
register_route(Route("sm120", "cute", sm120_backend.support))
register_route(Route("sm100", "cute", sm100_backend.support))

__all__ = ["BACKENDS"]
