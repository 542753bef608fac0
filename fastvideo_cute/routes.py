"""Route selection: which backend serves a call, and why.

One place decides. Every backend (:mod:`fastvideo_cute.backends`) has a support predicate that
returns ``(ok, reason)``; selection walks the preference list for the call and takes the first
backend that can serve it. Environment variables (:mod:`fastvideo_cute.env`) are read on every
eager call; under ``torch.compile`` they are read once, when the graph is traced, and the chosen
backend is recorded in the graph (an argument of the forward op), so the forward and the backward
of a compiled call always run on the same backend (re-trace to pick up a changed variable).

- ``FASTVIDEO_VSA_TRITON=1``  forces the Triton route.
- ``FASTVIDEO_VSA_CUTEDSL=1`` asks for the CuTe route (FA4 block sparsity, or our own CuTe
  kernels where FA4 cannot serve).
- ``FASTVIDEO_VSA_BACKEND=<name>`` forces one named backend (``triton``, ``fa4``, ``sm120``, ...).

A forced backend that cannot serve a call raises :class:`RouteError` with the reason. An
automatic fallback (CuTe asked for, not forced by name, cannot serve this call) logs the reason
once per distinct reason and takes the Triton route. No silent wrong answers.
"""

from __future__ import annotations

import logging
from typing import List

import torch

from .backends import BACKENDS, Backend
from .call import CallInfo, call_info
from .env import BACKEND_VAR, TRITON_FLAG, env_flag, route_request
from .errors import EnvError, RouteError

logger = logging.getLogger("fastvideo_cute")

__all__ = ["RouteError", "EnvError", "CallInfo", "call_info", "select_route", "select_route_name", "route_names",
           "cute_preferences", "env_flag"]


def route_names() -> List[str]:
    return sorted(BACKENDS)


_LOGGED: set = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.warning(message)


def cute_preferences(info: CallInfo) -> List[str]:
    """CuTe backends to try, best first, for this call: FA4 block sparsity on sm_90/sm_100, our
    own mma.sync + TMA forward on sm_120/121 (FA4 has no block sparsity there). The sm120 kernel
    also runs on sm_90, but only when named (``FASTVIDEO_VSA_BACKEND=sm120``); the sm100
    (tcgen05, 64-token) kernels join only once verified on hardware."""
    major = info.arch_major
    if major == 12:
        return ["sm120"]
    if major == 10:
        return ["fa4", "sm100"] if BACKENDS["sm100"].verified_on(info.arch) else ["fa4"]
    return ["fa4"]


def _forced(name: str, info: CallInfo) -> Backend:
    backend = BACKENDS.get(name)
    if backend is None:
        raise RouteError(f"{BACKEND_VAR}={name!r} is not a backend; expected one of {route_names()}")
    ok, reason = backend.support(info)
    if not ok:
        raise RouteError(f"{BACKEND_VAR}={name} cannot serve this call: {reason}")
    return backend


def select_route(info: CallInfo) -> Backend:
    """The backend for a call. Raises :class:`RouteError` when a forced route cannot serve, and
    :class:`EnvError` (a ``RouteError``) when the route variables are malformed or conflict."""
    want_triton, want_cute, named = route_request()
    if named:
        return _forced(named, info)
    triton = BACKENDS["triton"]
    if want_cute:
        reasons = []
        for name in cute_preferences(info):
            backend = BACKENDS.get(name)
            if backend is None:
                continue
            ok, reason = backend.support(info)
            if ok:
                return backend
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
        prefix = f"{TRITON_FLAG}=1, but the Triton route" if want_triton else "the Triton route"
        raise RouteError(f"{prefix} cannot serve this call: {reason}")
    return triton


@torch._dynamo.assume_constant_result
def _select_name_traced(*fields) -> str:
    return select_route(CallInfo(*fields)).name


def select_route_name(info: CallInfo) -> str:
    """:func:`select_route`'s backend name; while ``torch.compile`` traces, evaluated once as a
    constant of the graph (the selection reads the environment and logs, which Dynamo cannot trace)."""
    if torch.compiler.is_compiling():
        # Plain fields, not the dataclass: Dynamo passes constant-result functions plain values only.
        return _select_name_traced(info.op, info.device_type, info.arch, info.dtype, info.head_dim,
                                   info.block_size, info.need_grad, info.batch, info.heads, info.q_len,
                                   info.kv_len, info.bshd, info.need_lse, info.kv_all_full)
    return select_route(info).name
