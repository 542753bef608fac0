"""Backends behind the routes, one object each implementing the protocol of :mod:`.base`,
registered in the one registry (:mod:`.registry`). CuTe/FA4 code is imported only inside their
methods, so importing this package never imports the CuTe DSL."""

from __future__ import annotations

from . import registry
from .base import Backend, CompileKey
from .cudnn_backend import CudnnBackend
from .fa4_backend import FA4Backend
from .registry import REGISTRY as BACKENDS
from .sm100_backend import Sm100Backend
from .sm120_backend import Sm120Backend
from .sm90_backend import Sm90Backend
from .triton_backend import TritonBackend

for _backend in (TritonBackend(), FA4Backend(), CudnnBackend(), Sm120Backend(), Sm100Backend(), Sm90Backend()):
    registry.register(_backend)

__all__ = ["BACKENDS", "Backend", "CompileKey", "registry"]
