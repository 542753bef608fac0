"""Route selection: which backend serves a call, and why.

One place decides. Each route has a support predicate that returns ``(ok, reason)``;
selection walks the preference list for the call and takes the first route that can serve
it. Environment variables are read on every call, so they can be flipped at run time:

- ``FASTVIDEO_VSA_TRITON=1``  forces the Triton route.
- ``FASTVIDEO_VSA_CUTEDSL=1`` asks for the CuTe route (FA4 block sparsity, or our own CuTe
  kernels where FA4 cannot serve).
- ``FASTVIDEO_VSA_BACKEND=<name>`` forces one named backend (``triton``, ``fa4``, ``sm120``).

A forced route that cannot serve a call raises :class:`RouteError` with the reason. An
automatic fallback (CuTe asked for, not forced by name, cannot serve this call) logs the
reason once per distinct reason and takes the Triton route. No silent wrong answers.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Dict, List, Optional, Tuple

import torch

logger = logging.getLogger("fastvideo_cute")

__all__ = ["RouteError", "CallInfo", "Route", "select_route", "register_route", "route_names"]


class RouteError(RuntimeError):
    """A forced route cannot serve the call (the message says why)."""


@dataclasses.dataclass(frozen=True)
class CallInfo:
    """What a route needs to know about one call (all static: shapes, dtype, flags)."""

    op: str  # "block_sparse" (forward or backward of the block-sparse attention)
    device_type: str
    arch: Optional[Tuple[int, int]]  # CUDA compute capability, None off-GPU
    dtype: torch.dtype
    head_dim: int
    block_size: int  # logical block size (64, 128 or 256)
    need_grad: bool
    batch: int = 1
    heads: int = 1
    q_len: int = 0
    kv_len: int = 0
    bshd: bool = False
    need_lse: bool = True  # False when the caller discards the LSE (video_sparse_attn's sparse branch)
    kv_all_full: bool = False  # every kv block full (from the cached range check; False when unknown)


@dataclasses.dataclass(frozen=True)
class Route:
    name: str
    family: str  # "triton" or "cute"
    support: Callable[[CallInfo], Tuple[bool, str]]


_ROUTES: Dict[str, Route] = {}


def register_route(route: Route) -> None:
    _ROUTES[route.name] = route


def route_names() -> List[str]:
    return sorted(_ROUTES)


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


_LOGGED: set = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.warning(message)


def call_info(q: torch.Tensor, k: torch.Tensor, block_size: int, need_grad: bool, bshd: bool,
              need_lse: bool = True, kv_block_sizes: Optional[torch.Tensor] = None) -> CallInfo:
    from .validation import has_partial_blocks

    arch = None
    if q.device.type == "cuda":
        arch = torch.cuda.get_device_capability(q.device)
    s_dim, h_dim = (1, 2) if bshd else (2, 1)
    return CallInfo("block_sparse", q.device.type, arch, q.dtype, q.shape[-1], block_size, need_grad,
                    batch=q.shape[0], heads=q.shape[h_dim], q_len=q.shape[s_dim], kv_len=k.shape[s_dim], bshd=bshd,
                    need_lse=need_lse,
                    kv_all_full=kv_block_sizes is not None and not has_partial_blocks(kv_block_sizes, block_size))


def _cute_preferences(info: CallInfo) -> List[str]:
    """CuTe backends to try, best first, for this call: FA4 block sparsity on sm_90/sm_100, our
    own mma.sync + TMA forward on sm_120/121 (FA4 has no block sparsity there). The sm120 kernel
    also runs on sm_90, but only when named (FASTVIDEO_VSA_BACKEND=sm120); the sm100 (tcgen05,
    64-token) kernels only when named until they are verified on hardware."""
    if info.arch is not None and info.arch[0] == 12:
        return ["sm120"]
    if info.arch is not None and info.arch[0] == 10:
        from .backends.sm100_backend import verified_on_hardware

        # Our tcgen05 64-token kernels join only once a 10.x GPU has passed their tests.
        return ["fa4", "sm100"] if verified_on_hardware() else ["fa4"]
    return ["fa4"]


def select_route(info: CallInfo) -> Route:
    """Pick the route for a call. Raises :class:`RouteError` when a forced route cannot serve."""
    forced_name = os.environ.get("FASTVIDEO_VSA_BACKEND", "").strip().lower()
    want_triton = env_flag("FASTVIDEO_VSA_TRITON")
    want_cute = env_flag("FASTVIDEO_VSA_CUTEDSL")
    if want_triton and want_cute:
        raise RouteError("FASTVIDEO_VSA_TRITON=1 and FASTVIDEO_VSA_CUTEDSL=1 are both set; set one of them")
    if forced_name:
        route = _ROUTES.get(forced_name)
        if route is None:
            raise RouteError(f"FASTVIDEO_VSA_BACKEND={forced_name!r} is not a backend; expected one of {route_names()}")
        ok, reason = route.support(info)
        if not ok:
            raise RouteError(f"FASTVIDEO_VSA_BACKEND={forced_name} cannot serve this call: {reason}")
        return route

    triton = _ROUTES["triton"]
    if want_cute:
        reasons = []
        for name in _cute_preferences(info):
            route = _ROUTES.get(name)
            if route is None:
                continue
            ok, reason = route.support(info)
            if ok:
                return route
            reasons.append(f"{name}: {reason}")
        ok, reason = triton.support(info)
        why = "; ".join(reasons) or "no CuTe backend is registered"
        if not ok:
            raise RouteError(f"no route can serve this call (CuTe: {why}; triton: {reason})")
        _log_once(f"fastvideo_cute: CuTe route cannot serve block_size={info.block_size} "
                  f"dtype={info.dtype} head_dim={info.head_dim} grad={info.need_grad} "
                  f"on {info.device_type}{info.arch or ''} ({why}); using Triton")
        return triton

    ok, reason = triton.support(info)
    if not ok:
        prefix = "FASTVIDEO_VSA_TRITON=1, but the Triton route" if want_triton else "the Triton route"
        raise RouteError(f"{prefix} cannot serve this call: {reason}")
    return triton
