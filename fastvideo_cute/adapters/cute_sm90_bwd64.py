"""Torch adapter for the Hopper VSA block-sparse backward, 64-token blocks (wgmma main kernel).

The chain of :mod:`fastvideo_cute.adapters.cute_sm100_bwd` with an sm_90a main kernel in stage 3:
preprocess (CuTe DSL, verified on the H200) -> work order (torch) -> main -> postprocess (CuTe DSL).
Two main kernels (``main``): "single" (``kernels/cute/block_sparse_bwd64/block_sparse_bwd64_sm90.py``:
one warpgroup, one CTA per kv block, dQ staged and bulk-reduced in fp32, or atomics) and "ws"
(``block_sparse_bwd64_sm90_ws.py``: warp-specialized, its chain with q groups in
:mod:`fastvideo_cute.adapters.cute_sm90_bwd64_ws`). Same contract as ``sm100_block_sparse_bwd64``:
q, k, v, out, dout ``[B, H, S, 128]`` bf16 contiguous with ``S = 64 * nb``, ``nb`` even; lse
natural-log fp32 ``[B, H, S]``; k2q lists (``invert_indices`` layout); kv_block_sizes ``[nb]``
(padded keys masked, their dk/dv rows exactly 0; NaN/Inf padding never leaks). dq is accumulated
in fp32 in no fixed order (bulk reductions or atomics), so it is not bitwise run-to-run (dk and dv
are).

Routed: the ``sm90`` backend's backward runs ``main="ws"`` (``backends/sm90_backend._BWD_WS_CONFIG``);
"single" is not routed. Measured beside cuDNN BSA's blk64 backward on the same inputs
(``benchmarks/explore_bwd64_sm90.py``): "single" 0.61x at S=32768, 0.59x on the Wan-1.3B grid
(``benchmarks/results/bwd64_sm90_h200_v8.json``), with ``dq_reduce="flat"`` 1.00-1.03x and
0.95-1.01x (``bwd64_sm90_h200_v22.json`` ... ``_v24.json``; its dq_accum tiles are in register order,
the chain's postprocess follows); "ws" in the route's configuration (``flat_dq``)
1.063x at S=32768, 1.025x on the grid, 1.007x at S=65536 (``bwd64_sm90_h200_v17.json``), so route table
v9 ranks it first for the 64-token partial-tile backward and second, after cuDNN's, for full tiles
(``benchmarks/results/vsa_h200_table9_bwd64_*.json``). With ``flat_dq`` the chain's ``dq_accum``
tiles are in the main kernel's register order and the postprocess is ``postprocess_frag``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from fastvideo_cute.kernels.cute import block_sparse_bwd64 as _kernels  # names and limits only: no CuTe import
from fastvideo_cute.kernels.cute.block_sparse_bwd64.limits import BLOCK, HEAD_DIM, SM90_CAPABILITIES

from ._checks import cute_dsl_importable
from .cute_sm100_bwd import _check_activations, _check_meta, run_bwd64_chain
from .cute_sm90_bwd64_ws import GROUP_BLOCKS_DEFAULT, GROUP_MIN_BLOCKS, default_groups, device_name, run_ws_chain

__all__ = ["sm90_bwd64_support", "sm90_block_sparse_bwd64", "compiled_sm90_main", "MAX_ELEMS"]

#: the main kernel addresses dq_accum / dk / dv with int32 element offsets
MAX_ELEMS = 2**31 - 1
#: how the main kernel adds dQ into dq_accum (``block_sparse_bwd64_sm90.DQ_REDUCE``): "bulk" measured
#: 1.6x faster than "atomic" on the H200 (7.97 vs 12.83 ms at S=32768, 11.68 vs 18.83 ms on the
#: Wan-1.3B grid; ``benchmarks/results/bwd64_sm90_h200_v2.json``)
DQ_REDUCE_DEFAULT = "bulk"


def sm90_bwd64_support(q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes) -> Tuple[bool, str]:
    """``(True, "")`` iff :func:`sm90_block_sparse_bwd64` can run these tensors here, else ``(False,
    reason)``; static facts only (never reads values)."""
    ok, reason = _check_activations(q, k, v, out, dout)
    if not ok:
        return ok, reason
    cap = torch.cuda.get_device_capability(q.device) if q.is_cuda else None
    if cap not in SM90_CAPABILITIES:
        return False, f"needs a compute capability 9.0 GPU (sm_90a), got {cap}"
    ok, reason = _check_meta(q, lse, k2q_idx, k2q_num, kv_block_sizes)
    if not ok:
        return ok, reason
    if q.numel() > MAX_ELEMS:
        return False, f"B*H*S*128 = {q.numel()} elements exceeds the kernel's int32 offsets ({MAX_ELEMS})"
    if not cute_dsl_importable():
        return False, ("the CuTe DSL (nvidia-cutlass-dsl, cuda-bindings) is not installed "
                       "(pip install 'fastvideo-cute[cute]')")
    return True, ""


#: the main kernels: "single" (``block_sparse_bwd64_sm90``: one warpgroup does every MMA, two CTAs
#: per SM; ``dq_reduce`` / ``stats_in_smem`` configure it) and "ws" (``block_sparse_bwd64_sm90_ws``:
#: warp-specialized, a producer warp, a dQ store warp and two MMA warpgroups, one CTA per SM)
MAINS = ("single", "ws")


def compiled_sm90_main(dq_reduce: str = DQ_REDUCE_DEFAULT, stats_in_smem: bool = False, main: str = "single",
                       ws_config: Optional[dict] = None):
    """The wgmma main kernel compiled (TVM-FFI) for sm_90a through :mod:`fastvideo_cute.jit`
    (``ws_config``: keyword arguments of ``BlockSparseBwd64Sm90Ws``, for ``main="ws"``)."""
    if main not in MAINS:
        raise ValueError(f"main must be one of {MAINS}, got {main!r}")
    if main == "ws":
        return _kernels.sm90_ws_main_kernel(**(ws_config or {})).compile("sm_90a")
    return _kernels.sm90_main_kernel(dq_reduce, stats_in_smem).compile("sm_90a")


def sm90_block_sparse_bwd64(q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes,
                            sm_scale: Optional[float] = None, dq_reduce: str = DQ_REDUCE_DEFAULT,
                            stats_in_smem: bool = False, main: str = "single", ws_config: Optional[dict] = None,
                            order_policy: str = "auto"):
    """The whole backward; returns ``(dq, dk, dv)``, bf16 ``[B, H, S, 128]`` (module docstring).
    ``dq_reduce``: the main kernel's dQ path ("atomic" / "bulk" / "flat"); ``stats_in_smem``: the kernel's
    lse2/delta by bulk copy into shared memory; ``main``: which main kernel (:data:`MAINS`; "ws" is
    configured by ``ws_config`` instead: ``BlockSparseBwd64Sm90Ws``'s keyword arguments and
    ``group_blocks`` / ``group_min_blocks``, the q groups of ``cute_sm90_bwd64_ws.run_ws_chain``,
    ``group_blocks=0`` for none; neither given: ``cute_sm90_bwd64_ws.default_groups`` for this GPU);
    ``order_policy``: the chain's work order (``cute_sm100_bwd.ORDER_POLICIES``). Raises ``ValueError`` naming the reason when :func:`sm90_bwd64_support`
    refuses."""
    if main not in MAINS:
        raise ValueError(f"sm90_block_sparse_bwd64: main must be one of {MAINS}, got {main!r}")
    ok, reason = sm90_bwd64_support(q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes)
    if not ok:
        raise ValueError(f"sm90_block_sparse_bwd64: {reason}")
    if sm_scale is None:
        sm_scale = HEAD_DIM**-0.5
    if not math.isfinite(sm_scale):
        raise ValueError("sm90_block_sparse_bwd64: sm_scale must be finite")
    if main == "ws":
        cfg = dict(ws_config or {})
        if "group_blocks" in cfg or "group_min_blocks" in cfg or not q.is_cuda:
            group_blocks = cfg.pop("group_blocks", GROUP_BLOCKS_DEFAULT) or None  # 0: no q groups
            group_min = cfg.pop("group_min_blocks", GROUP_MIN_BLOCKS)
        else:  # this GPU's rule (cute_sm90_bwd64_ws.default_groups)
            index = q.device.index if q.device.index is not None else torch.cuda.current_device()
            group_blocks, group_min = default_groups(q.shape[2] // BLOCK, device_name(index))
        if "grouped" in cfg:
            raise ValueError("sm90_block_sparse_bwd64: ws_config's 'grouped' follows from group_blocks")
        return run_ws_chain(lambda grouped: compiled_sm90_main(main="ws", ws_config={**cfg, "grouped": grouped}),
                            q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes, sm_scale, order_policy,
                            group_blocks, group_min, dq_frag=bool(cfg.get("flat_dq", False)),
                            ticket_dkv=bool(cfg.get("ticket_dkv", False)))
    fn = compiled_sm90_main(dq_reduce, stats_in_smem, main, ws_config) if q.numel() else None
    return run_bwd64_chain(fn, q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes, sm_scale, order_policy,
                           frag_order=dq_reduce == "flat")
