"""The plan: which route serves each (workload, mode) on a target, decided by the routes'
own support predicates; our registry CuTe kernels to compile; workloads from presets or shapes."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from ..warmup_presets import get_preset, tile_for_block
from .variants import (SM120_REGISTRY_NAMES, PlanUnit, Target, Workload, cute_arch_str, sm120_variant,
                       synthetic_call_info)


_MODES = ("train", "infer")


@contextlib.contextmanager
def route_env(route: str = "auto", backend: Optional[str] = None) -> Iterator[None]:
    """Set the route variables for the duration: ``auto`` leaves them as they are (what the app
    will see), ``triton`` / ``cute`` ask for that route, ``backend`` forces one named backend."""
    if backend:
        wanted: Dict[str, Optional[str]] = {"FASTVIDEO_VSA_TRITON": None, "FASTVIDEO_VSA_CUTEDSL": None,
                                            "FASTVIDEO_VSA_BACKEND": backend}
    elif route == "triton":
        wanted = {"FASTVIDEO_VSA_TRITON": "1", "FASTVIDEO_VSA_CUTEDSL": None, "FASTVIDEO_VSA_BACKEND": None}
    elif route == "cute":
        wanted = {"FASTVIDEO_VSA_TRITON": None, "FASTVIDEO_VSA_CUTEDSL": "1", "FASTVIDEO_VSA_BACKEND": None}
    elif route == "auto":
        wanted = {}
    else:
        raise ValueError(f"route must be auto, triton or cute, got {route!r}")
    saved = {name: os.environ.get(name) for name in wanted}
    try:
        for name, value in wanted.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def enumerate_plan(workloads: Sequence[Workload], target: Target, modes: Sequence[str] = _MODES,
                   route: str = "auto", backend: Optional[str] = None) -> List[PlanUnit]:
    """Which route serves each (workload, mode) on ``target``, and the variant keys it compiles.

    Uses :func:`fastvideo_cute.routes.select_route` itself (the routes' support predicates and
    the environment variables, set by ``route``/``backend`` as :func:`route_env` does), so the
    plan is the decision the op will make, direction by direction (the route table may put the
    forward and the backward of one call on different backends; ``PlanUnit.route`` then reads
    ``"fwd|bwd"`` and each direction's key names its own backend)."""
    import dataclasses

    from ..backends import BACKENDS
    from ..routes import RouteError, cute_preferences, env_flag, select_routes, select_vsa_routes

    units: List[PlanUnit] = []
    with route_env(route, backend), _quiet_route_log():
        for w in workloads:
            for mode in modes:
                need_grad = mode == "train"
                info = synthetic_call_info(w, target, need_grad)
                vsa_gated = w.entry == "vsa" and w.gated
                try:
                    # video_sparse_attn's own rule first (gated inference may take the fused-gate kernel)
                    fwd, bwd = select_vsa_routes(info, True) if vsa_gated else select_routes(info)
                except RouteError as exc:
                    units.append(PlanUnit(w, mode, None, error=str(exc)))
                    continue
                chosen = fwd.name
                unit = PlanUnit(w, mode, chosen if fwd is bwd else f"{fwd.name}|{bwd.name}")
                if env_flag("FASTVIDEO_VSA_CUTEDSL") and chosen == "triton":
                    reasons = [f"{name}: {BACKENDS[name].support(info)[1]}" for name in cute_preferences(info)
                               if name in BACKENDS]
                    unit.note = "CuTe falls back: " + ("; ".join(reasons) or "no CuTe backend is registered")
                # Each direction's key from the backend that runs it (they may differ: the route table).
                fwd_info = dataclasses.replace(info, need_grad=False)
                if vsa_gated and getattr(fwd, "fuses_gate", False):
                    # the fused-gate kernel (training: the build that also stores out_s)
                    unit.keys["fwd"] = fwd.compile_keys(fwd_info, gated="train" if need_grad else True)["fwd"]
                else:
                    unit.keys["fwd"] = fwd.compile_keys(fwd_info)["fwd"]
                if need_grad:
                    unit.keys["bwd"] = bwd.compile_keys(info)["bwd"]
                units.append(unit)
    return units


@contextlib.contextmanager
def _quiet_route_log() -> Iterator[None]:
    """The plan carries the fallback reasons; keep the route logger's WARNINGs off the console."""
    import logging

    log = logging.getLogger("fastvideo_cute")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def own_kernels_for(target: Target, policy: str = "auto", route: str = "auto",
                    names: Optional[Sequence[str]] = None) -> List[Tuple[str, str]]:
    """Our registry kernels to compile for the target: ``[(registry name, --gpu-arch)]``.

    ``names``: exactly these registry kernels. ``all``: every registry kernel that targets the
    arch. ``none``: nothing. ``auto``: the variant the sm120 adapter compiles for the target
    (``$FASTVIDEO_CUTE_SM120_KERNEL``, else its per-arch default) when the CuTe route is asked for (``--route cute`` or
    ``FASTVIDEO_VSA_CUTEDSL=1``) on a GPU FA4 does not serve (sm_120/sm_121: there the mma.sync
    kernel is the CuTe route; its sm_90a build is a verification target, not the H200's route)."""
    if target.arch is None or (policy == "none" and not names):
        return []
    from ..kernels.cute import REGISTRY
    from ..env import env_flag

    arch = cute_arch_str(target.arch)
    targeted = [spec.name for spec in REGISTRY if arch in spec.archs]
    if names:
        unknown = [n for n in names if n not in {spec.name for spec in REGISTRY}]
        if unknown:
            raise ValueError(f"no CuTe kernel named {unknown}; known: {[spec.name for spec in REGISTRY]}")
        return [(n, arch) for n in names if n in targeted]
    if policy == "all":
        return [(n, arch) for n in targeted]
    if policy != "auto":
        raise ValueError(f"cute-kernels policy must be auto, all or none, got {policy!r}")
    wants_cute = route == "cute" or (route == "auto" and env_flag("FASTVIDEO_VSA_CUTEDSL"))
    if not wants_cute or target.arch[0] in (9, 10):
        return []
    wanted = SM120_REGISTRY_NAMES.get(sm120_variant(target.arch))
    return [(n, arch) for n in targeted if n == wanted]


# ==============================================================================================
# Workloads from the command line
# ==============================================================================================


def preset_workloads(name: str, blocks: Optional[Sequence[int]], dtypes: Optional[Sequence[str]], layout: str,
                     batch: int, sparsity: Optional[float], entries: Sequence[str] = ("vsa",)) -> List[Workload]:
    p = get_preset(name)
    out = []
    for block in blocks or (p.block_size,):
        tile = tile_for_block(block)
        seq = p.seq_len(block)
        kvb = seq // block
        sp = p.sparsity if sparsity is None else sparsity
        topk = max(1, math.ceil((1.0 - sp) * kvb))
        for dtype in dtypes or (p.dtype,):
            for entry in entries:
                out.append(Workload(p.name, batch, p.heads, seq, p.head_dim, block, dtype, layout, p.latent_grid,
                                    tile, topk, entry))
    return out


def shape_workloads(shape: Sequence[int], blocks: Optional[Sequence[int]], dtypes: Optional[Sequence[str]],
                    layout: str, sparsity: Optional[float], entries: Sequence[str] = ("vsa",)) -> List[Workload]:
    b, h, s, d = (int(x) for x in shape)
    if min(b, h, s, d) < 1:
        raise ValueError(f"--shape B H S D must be positive, got {tuple(shape)}")
    out = []
    for block in blocks or (64,):
        if s % block:
            raise ValueError(f"--shape: S={s} is not a multiple of block size {block}")
        kvb = s // block
        topk = max(1, math.ceil((1.0 - (0.5 if sparsity is None else sparsity)) * kvb))
        for dtype in dtypes or ("bf16",):
            for entry in entries:
                out.append(Workload(f"shape-{b}x{h}x{s}x{d}", b, h, s, d, block, dtype, layout, None, None, topk,
                                    entry))
    return out
