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

``video_sparse_attn`` adds one rule before these (:func:`select_vsa_route_name`): an inference
call (no grad) with a gate that the ``sm90`` backend serves, verified on this arch (sm_90,
64-, 128- or 256-token blocks: ``VSA_GATED_BLOCKS``), takes ``sm90`` unless a backend is named
or Triton forced: its kernel fuses the
gate composition into the forward's epilogue and masks K/V padding itself, 1.01-1.06x the cuDNN
path (``benchmarks/results/fwd64_sm90_h200_v5.json``). Plain ``block_sparse_attn`` calls keep
the table (which ranks ``sm90`` first for the 64-token forward and the 128/256-token partial-tile
forwards; its kernel is 1.06-1.10x cuDNN's blk64 forward since it rescales lazily and skips the
row-max reduction of warps whose maxima stay, ``benchmarks/results/fwd64_sm90_h200_v11.json``).

A forced backend that cannot serve a call raises :class:`RouteError` with the reason. An
automatic fallback (CuTe asked for, not forced by name, cannot serve this call) logs the reason
once per distinct reason and takes the Triton route. No silent wrong answers.

The measured route table (:mod:`fastvideo_cute.route_table`) orders the backends per call class
and direction. With no variable set, and with ``FASTVIDEO_VSA_CUTEDSL=1``, each direction takes
the first backend of its class's order that is registered, verified on this GPU's arch
(``Backend.verified_on``) and supports the call; so the forward and the backward of one call
may run on different backends (every backend that returns an LSE follows one contract: natural
log, fp32 ``[B, H, S_q]``, ``-inf`` for rows without a key). A class the table does not list
falls back to the rules above (Triton by default; the CuTe preferences with
``FASTVIDEO_VSA_CUTEDSL=1``), one backend for both directions. A malformed or stale table is
rejected: the error is logged once and routing runs without it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import List, Optional, Tuple

import torch

from .backends import BACKENDS, Backend
from .call import CallInfo, call_info
from .env import BACKEND_VAR, TRITON_FLAG, env_flag, route_request
from .errors import EnvError, RouteError
from .route_table import RouteTable, RouteTableError, active_route_table, class_key

logger = logging.getLogger("fastvideo_cute")

__all__ = ["RouteError", "EnvError", "CallInfo", "call_info", "select_route", "select_routes", "select_route_name",
           "select_vsa_routes", "select_vsa_route_name", "route_names", "cute_preferences", "env_flag", "ROUTE_SEP",
           "VSA_GATED_BACKEND"]

ROUTE_SEP = "|"  # "forward backend|backward backend" in the op's route argument
#: the backend video_sparse_attn's gated inference calls take where it serves them (select_vsa_routes)
VSA_GATED_BACKEND = "sm90"
#: the block sizes that rule covers (128/256: vsa_e2e_h200_v17_tiles.json, 1.89 / 1.75 ms vs v7's
#: 2.56 / 2.11 ms on the FA4 route with its gate pass)
VSA_GATED_BLOCKS = (64, 128, 256)
# CallInfo's fields in order (Dynamo cannot trace dataclasses.fields; a test keeps this in step).
CALL_FIELDS = ("op", "device_type", "arch", "dtype", "head_dim", "block_size", "need_grad", "batch", "heads", "q_len",
               "kv_len", "bshd", "need_lse", "kv_all_full")


def route_names() -> List[str]:
    return sorted(BACKENDS)


_LOGGED: set = set()


def _log_once(message: str) -> None:
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.warning(message)


def cute_preferences(info: CallInfo) -> List[str]:
    """CuTe backends to try, best first, for this call: FA4 block sparsity on sm_90/sm_100, our
    own mma.sync + TMA forward on sm_120/121 (FA4 has no block sparsity there). On sm_90 our wgmma
    64-token kernels (``sm90``) come after FA4: they serve the 64-token training calls FA4's
    backward cannot (it needs 128-wide kv tiles). The sm120 kernel also runs on sm_90, but only
    when named (``FASTVIDEO_VSA_BACKEND=sm120``); the sm100 (tcgen05, 64-token) kernels join only
    once verified on hardware."""
    major = info.arch_major
    if major == 12:
        return ["sm120"]
    if major == 10:
        return ["fa4", "sm100"] if BACKENDS["sm100"].verified_on(info.arch) else ["fa4"]
    if major == 9 and BACKENDS["sm90"].verified_on(info.arch):
        return ["fa4", "sm90"]
    return ["fa4"]


def _forced(name: str, info: CallInfo) -> Backend:
    backend = BACKENDS.get(name)
    if backend is None:
        raise RouteError(f"{BACKEND_VAR}={name!r} is not a backend; expected one of {route_names()}")
    ok, reason = backend.support(info)
    if not ok:
        raise RouteError(f"{BACKEND_VAR}={name} cannot serve this call: {reason}")
    return backend


def _legacy(info: CallInfo, want_triton: bool, want_cute: bool) -> Backend:
    """One backend for the whole call, without the table: Triton, or the CuTe preferences."""
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


def _table() -> Optional[RouteTable]:
    try:
        return active_route_table(BACKENDS)
    except RouteTableError as exc:
        _log_once(f"fastvideo_cute: {exc}; routing without the table")
        return None


def _direction_call(info: CallInfo, direction: str) -> CallInfo:
    """What a backend must support to serve one direction: the forward of a training call must
    return an LSE (for whichever backend runs the backward); the backward needs the full call."""
    if direction == "bwd":
        return info
    return dataclasses.replace(info, need_grad=False, need_lse=info.need_lse or info.need_grad)


def _from_table(table: Optional[RouteTable], info: CallInfo, direction: str) -> Optional[Backend]:
    if table is None or info.arch is None:
        return None
    arch = f"sm_{info.arch[0]}{info.arch[1]}"
    order = table.order(class_key(arch, info.block_size, direction, info.kv_all_full, info.head_dim))
    if not order:
        return None
    call = _direction_call(info, direction)
    for name in order:
        backend = BACKENDS.get(name)
        if backend is not None and backend.verified_on(info.arch) and backend.support(call)[0]:
            return backend
    return None


def select_routes(info: CallInfo) -> Tuple[Backend, Backend]:
    """``(forward backend, backward backend)`` for a call (the same one twice without grad, or
    when forced or chosen without the table). Raises :class:`RouteError` when a forced route
    cannot serve, and :class:`EnvError` (a ``RouteError``) when the route variables are malformed
    or conflict."""
    want_triton, want_cute, named = route_request()
    if named:
        backend = _forced(named, info)
        return backend, backend
    if not want_triton:
        table = _table()
        fwd = _from_table(table, info, "fwd")
        bwd = _from_table(table, info, "bwd") if info.need_grad else fwd
        if fwd is not None and bwd is not None:
            return fwd, bwd
        if fwd is not None or bwd is not None:
            # One direction has a measured winner: the other takes the rules without the table.
            other = _legacy(_direction_call(info, "fwd" if fwd is None else "bwd"), want_triton, want_cute)
            return (fwd or other), (bwd or other)
    backend = _legacy(info, want_triton, want_cute)
    return backend, backend


def select_route(info: CallInfo) -> Backend:
    """The forward backend of :func:`select_routes`."""
    return select_routes(info)[0]


def _select_names_traced(*fields) -> str:
    fwd, bwd = select_routes(CallInfo(*fields))
    return fwd.name + ROUTE_SEP + bwd.name


# What ``torch._dynamo.assume_constant_result`` does (it only sets this attribute), without
# importing torch._dynamo (and, through it, Triton) when the package is imported; a test checks
# Dynamo still treats the call as a constant.
_select_names_traced._dynamo_marked_constant = True


def select_route_name(info: CallInfo) -> str:
    """``"<forward backend>|<backward backend>"``; while ``torch.compile`` traces, evaluated once
    as a constant of the graph (the selection reads the environment and logs, which Dynamo
    cannot trace)."""
    if torch.compiler.is_compiling():
        # Plain fields, not the dataclass: Dynamo passes constant-result functions plain values only.
        return _select_names_traced(*[getattr(info, name) for name in CALL_FIELDS])
    fwd, bwd = select_routes(info)
    return fwd.name + ROUTE_SEP + bwd.name


def _vsa_gated_backend(info: CallInfo, gated: bool) -> Optional[Backend]:
    """The VSA rule: the gated-inference backend for this call, or None (then the rules above)."""
    if not gated or info.need_grad or info.block_size not in VSA_GATED_BLOCKS:
        return None
    want_triton, _, named = route_request()  # malformed or conflicting variables raise here too
    if named or want_triton:
        return None
    backend = BACKENDS.get(VSA_GATED_BACKEND)
    if backend is None or not backend.verified_on(info.arch) or not backend.support(info)[0]:
        return None
    return backend


def select_vsa_routes(info: CallInfo, gated: bool) -> Tuple[Backend, Backend]:
    """:func:`select_routes` for ``video_sparse_attn``'s sparse branch: with no backend named and
    Triton not forced, an inference call with a gate (``gated``) that ``sm90`` serves, verified on
    this arch, takes ``sm90`` for its forward (its epilogue fuses the gate); every other call takes
    :func:`select_routes`'s answer (a named backend that cannot serve still raises there)."""
    backend = _vsa_gated_backend(info, gated)
    if backend is not None:
        return backend, backend
    return select_routes(info)


def _select_vsa_names_traced(gated, *fields) -> str:
    fwd, bwd = select_vsa_routes(CallInfo(*fields), gated)
    return fwd.name + ROUTE_SEP + bwd.name


_select_vsa_names_traced._dynamo_marked_constant = True  # as _select_names_traced


def select_vsa_route_name(info: CallInfo, gated: bool) -> str:
    """``"<forward backend>|<backward backend>"`` of :func:`select_vsa_routes`; a constant of the
    graph while ``torch.compile`` traces (as :func:`select_route_name`)."""
    if torch.compiler.is_compiling():
        return _select_vsa_names_traced(bool(gated), *[getattr(info, name) for name in CALL_FIELDS])
    fwd, bwd = select_vsa_routes(info, gated)
    return fwd.name + ROUTE_SEP + bwd.name
