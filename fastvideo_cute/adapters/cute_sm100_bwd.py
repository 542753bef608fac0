"""Torch adapter for the CuTe DSL VSA block-sparse backward, 64-token blocks (seed 000's chain).

Launch chain (``fastvideo_cute/kernels/cute/block_sparse_bwd64``):
  1. preprocess (CuTe DSL, sm_90a/sm_100a/sm_103a): ``delta = rowsum(o * dO)`` (fp32),
     ``lse2 = lse * log2(e)`` (``+inf`` where ``lse == -inf``), ``dq_accum = 0``, dk/dv rows of kv
     blocks with ``k2q_num == 0`` written as exact zeros;
  2. work order (torch, on device): ``None`` (identity) below ``ORDER_MIN_KV_BLOCKS`` kv blocks per
     sequence, else the length-binned order of the ``B*H*nb`` kv items (:func:`work_order`);
  3. main (CuTe DSL tcgen05, sm_100a): one CTA per kv item, dk/dv written, dq reduce-added;
  4. postprocess (CuTe DSL): ``dq = bf16(dq_accum * sm_scale)``, no-key rows exactly 0.

Contract (library conventions): q, k, v, out, dout ``[B, H, S, 128]`` bf16 contiguous, ``S = 64 *
nb`` with ``nb`` even (seed 000's predicate); lse natural-log fp32 ``[B, H, S]`` (``-inf`` rows: no
valid key, they contribute nothing and get dq 0); k2q lists in ``invert_indices`` layout (idx
``[B, H, nb, max_q]``, num ``[B, H, nb]``: the first ``num`` entries are the q blocks selecting kv
block j); kv_block_sizes ``[nb]``: keys at or past the size are masked and get exactly-zero dk/dv
rows; padding K/V may hold NaN/Inf. Scaling as the Triton backward: dq and dk carry sm_scale.

Status: stages 1, 2 and 4 (:func:`sm100_bwd64_common_stages`, :func:`work_order`,
:func:`sm100_bwd64_postprocess`) have GPU tests for any sm_90/sm_100/sm_103 GPU (the H200 is the
verification target). The tcgen05 main kernel compiles for sm_100a (and sm_103a) but has not run on
a GPU: :func:`sm100_block_sparse_bwd64` runs only by explicit opt-in (``FASTVIDEO_CUTE_SM100_BWD=1``
or ``allow_unverified=True``, with a warning) until a compute-capability 10.x run of
tests/kernels/cute/test_block_sparse_bwd64_gpu.py has passed; routes should not select it before.

Shapes, launch limits and the arch tables are the kernels' own (``block_sparse_bwd64/limits.py``);
every stage compiles through :mod:`fastvideo_cute.jit` (in process; on disk under
``$FASTVIDEO_CUTE_CACHE_DIR`` when set).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Dict, Optional, Tuple

import torch

from fastvideo_cute.kernels.cute import block_sparse_bwd64 as _kernels  # names and limits only: no CuTe import
from fastvideo_cute.kernels.cute.block_sparse_bwd64.limits import (BLOCK, COMMON_CAPABILITIES, HEAD_DIM,
                                                                    MAIN_CAPABILITIES, MAX_ROWS, ORDER_MIN_KV_BLOCKS)

from ._checks import check_block_lists, check_bhsd_bf16, cute_dsl_importable

__all__ = [
    "BLOCK",
    "HEAD_DIM",
    "ORDER_MIN_KV_BLOCKS",
    "ORDER_NUM_BINS",
    "ORDER_POLICIES",
    "COMMON_CAPABILITIES",
    "MAIN_CAPABILITIES",
    "OPT_IN_ENV",
    "main_kernel_available",
    "sm100_bwd64_support",
    "sm100_bwd64_common_support",
    "sm100_bwd64_common_stages",
    "sm100_bwd64_postprocess",
    "work_order",
    "emulate_main",
    "sm100_block_sparse_bwd64",
    "compiled_main",
    "compiled_stage",
    "run_bwd64_chain",
]

LOG2E = math.log2(math.e)
ORDER_NUM_BINS = 8
#: run_bwd64_chain's work-order policies
ORDER_POLICIES = ("auto", "identity")

OPT_IN_ENV = "FASTVIDEO_CUTE_SM100_BWD"


def main_kernel_available(arch: str = "sm_100a") -> bool:
    """True iff the tcgen05 main kernel is part of the package for ``arch`` (run there)."""
    return arch in MAIN_CAPABILITIES.values()


def _capability(t: torch.Tensor):
    return torch.cuda.get_device_capability(t.device) if t.is_cuda and torch.cuda.is_available() else None


def _check_activations(q, k, v, out, dout) -> Tuple[bool, str]:
    return check_bhsd_bf16((("q", q), ("k", k), ("v", v), ("out", out), ("dout", dout)), HEAD_DIM)


def _check_meta(q, lse, k2q_idx, k2q_num, kv_block_sizes) -> Tuple[bool, str]:
    batch, heads, seq, _ = q.shape
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or not lse.is_contiguous():
        return False, "lse must be a contiguous float32 tensor"
    if tuple(lse.shape) != (batch, heads, seq):
        return False, f"lse must be [B, H, S] = {(batch, heads, seq)}, got {tuple(lse.shape)}"
    if lse.device != q.device:
        return False, f"lse is on {lse.device}, q on {q.device}"
    if not isinstance(kv_block_sizes, torch.Tensor) or kv_block_sizes.dim() != 1:
        return False, f"kv_block_sizes must be [nb], got {getattr(kv_block_sizes, 'shape', None)}"
    nb = kv_block_sizes.numel()
    if nb < 1 or nb % 2 != 0:
        return False, f"the number of kv blocks must be even and >= 2 (the preprocess works on 128-token pairs), got {nb}"
    ok, reason = check_block_lists(q, "k2q_idx", k2q_idx, "k2q_num", k2q_num, kv_block_sizes, BLOCK, min_width=1)
    if not ok:
        return False, reason
    if batch * heads * seq > MAX_ROWS or (k2q_idx is not None and k2q_idx.numel() > MAX_ROWS):
        return False, f"exceeds the launch limits: B*H*S and the k2q list size must be <= {MAX_ROWS}"
    return True, ""


def sm100_bwd64_support(q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes) -> Tuple[bool, str]:
    """``(True, "")`` iff :func:`sm100_block_sparse_bwd64` can run these tensors here, else ``(False,
    reason)``. Seed 000's predicate and binding checks; static facts only (never reads values)."""
    ok, reason = _check_activations(q, k, v, out, dout)
    if not ok:
        return ok, reason
    cap = _capability(q)
    if cap not in MAIN_CAPABILITIES:
        return False, f"needs a compute capability 10.0 GPU (sm_100a), got {cap}"
    ok, reason = _check_meta(q, lse, k2q_idx, k2q_num, kv_block_sizes)
    if not ok:
        return ok, reason
    if not cute_dsl_importable():
        return False, ("the CuTe DSL (nvidia-cutlass-dsl, cuda-bindings) is not installed "
                       "(pip install 'fastvideo-cute[cute]')")
    if not main_kernel_available(MAIN_CAPABILITIES[cap]):
        return False, "the tcgen05 main kernel (block_sparse_bwd64_sm100) is not available yet"
    return True, ""


def sm100_bwd64_common_support(out, dout, lse, k2q_num, kv_block_sizes) -> Tuple[bool, str]:
    """The predicate of :func:`sm100_bwd64_common_stages`: the arch-independent stages run on
    sm_90, sm_100 and sm_103 (``COMMON_CAPABILITIES``)."""
    ok, reason = _check_activations(out, out, out, out, dout)
    if not ok:
        return ok, reason
    cap = _capability(out)
    if cap not in COMMON_CAPABILITIES:
        return False, f"needs compute capability 9.0, 10.0 or 10.3, got {cap}"
    if not cute_dsl_importable():
        return False, ("the CuTe DSL (nvidia-cutlass-dsl, cuda-bindings) is not installed "
                       "(pip install 'fastvideo-cute[cute]')")
    return _check_meta(out, lse, None, k2q_num, kv_block_sizes)


def compiled_stage(stage: str, arch: str):
    """A stage ("preprocess", "postprocess") compiled (TVM-FFI) for ``arch`` through
    :mod:`fastvideo_cute.jit` (once per process; from the disk cache when one is configured)."""
    return _kernels.stage_kernel(stage).compile(arch)


def _common_arch(t: torch.Tensor) -> str:
    return COMMON_CAPABILITIES[torch.cuda.get_device_capability(t.device)]


def sm100_bwd64_common_stages(
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    k2q_num: torch.Tensor,
    kv_block_sizes: torch.Tensor,
    dk: Optional[torch.Tensor] = None,
    dv: Optional[torch.Tensor] = None,
    with_order: bool = True,
    zero_dq: bool = True,
) -> Dict[str, torch.Tensor]:
    """Stage 1 (preprocess) and stage 2 (work order; skipped, ``order`` None, without ``with_order``)
    of the chain.

    Returns ``delta`` and ``lse2`` (fp32 ``[B, H, S]``), ``dq_accum`` (fp32 ``[B, H, S, 128]``, all
    zero; unwritten without ``zero_dq``, for a chain that never reads it), ``dk`` and ``dv`` (bf16,
    ``empty_like(out)`` unless given: the rows of kv blocks with
    ``k2q_num == 0`` are exactly 0, the others untouched, the main kernel's to write) and ``order``
    (int32 ``[B*H*nb]`` or None for the identity order)."""
    ok, reason = sm100_bwd64_common_support(out, dout, lse, k2q_num, kv_block_sizes)
    if not ok:
        raise ValueError(f"sm100_bwd64_common_stages: {reason}")
    dk = torch.empty_like(out) if dk is None else dk
    dv = torch.empty_like(out) if dv is None else dv
    for name, t in (("dk", dk), ("dv", dv)):
        if t.shape != out.shape or t.dtype != out.dtype or not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"sm100_bwd64_common_stages: {name} must be a contiguous, aligned bf16 tensor of out's shape")
    delta = torch.empty(lse.shape, dtype=torch.float32, device=out.device)
    lse2 = torch.empty_like(delta)
    dq_accum = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    num = k2q_num.to(torch.int32).reshape(-1).contiguous()
    if out.numel():
        fn = compiled_stage("preprocess" if zero_dq else "preprocess_nodq", _common_arch(out))
        with torch.cuda.device(out.device):
            fn(out.view(-1, HEAD_DIM), dout.view(-1, HEAD_DIM), lse.view(-1), delta.view(-1), lse2.view(-1),
               dq_accum.view(-1, HEAD_DIM), dk.view(-1, HEAD_DIM), dv.view(-1, HEAD_DIM), num)
    return {"delta": delta, "lse2": lse2, "dq_accum": dq_accum, "dk": dk, "dv": dv,
            "order": work_order(k2q_num, kv_block_sizes.numel()) if with_order else None}


def sm100_bwd64_postprocess(dq_accum: torch.Tensor, lse: torch.Tensor, sm_scale: float,
                            dq: Optional[torch.Tensor] = None, frag_order: bool = False) -> torch.Tensor:
    """Stage 4: ``dq = bf16(dq_accum * sm_scale)``; rows with ``lse == -inf`` exactly 0.
    ``frag_order``: ``dq_accum``'s 64-row tiles are in the Hopper warp-specialized kernel's register
    order (its ``flat_dq``; stage ``postprocess_frag`` un-permutes them)."""
    if dq_accum.dtype != torch.float32 or not dq_accum.is_contiguous() or dq_accum.shape[-1] != HEAD_DIM:
        raise ValueError("sm100_bwd64_postprocess: dq_accum must be a contiguous float32 [..., 128] tensor")
    if tuple(lse.shape) != tuple(dq_accum.shape[:-1]) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError("sm100_bwd64_postprocess: lse must be a contiguous float32 tensor of dq_accum's rows")
    if lse.numel() % BLOCK:
        raise ValueError(f"sm100_bwd64_postprocess: the row count must be a multiple of {BLOCK}")
    if not dq_accum.is_cuda or _capability(dq_accum) not in COMMON_CAPABILITIES:
        raise ValueError("sm100_bwd64_postprocess: needs a CUDA tensor on an sm_90/sm_100/sm_103 GPU")
    if dq is None:
        dq = torch.empty(dq_accum.shape, dtype=torch.bfloat16, device=dq_accum.device)
    if dq_accum.numel():
        fn = compiled_stage("postprocess_frag" if frag_order else "postprocess", _common_arch(dq_accum))
        with torch.cuda.device(dq_accum.device):
            fn(dq_accum.view(-1, HEAD_DIM), lse.view(-1), dq.view(-1, HEAD_DIM), float(sm_scale))
    return dq


def work_order(k2q_num: torch.Tensor, num_kv_blocks: int) -> Optional[torch.Tensor]:
    """Stage 2: the order the main kernel's CTAs take the ``B*H*nb`` kv items in.

    ``None`` (the identity, item = CTA) below ``ORDER_MIN_KV_BLOCKS`` kv blocks per sequence, where
    seed 000 measured the order's own cost to outweigh its gain. From there on, length bins: the
    items' k2q counts fall into ``ORDER_NUM_BINS`` equal-width bins over ``[0, max count]``, the
    longest bin first (the long lists start early, the short ones fill the tail), the identity
    order kept inside a bin (neighbouring kv blocks, whose q lists overlap, stay together for L2).
    Computed on the device, no host synchronization; int32 ``[B*H*nb]``, a permutation."""
    if num_kv_blocks < ORDER_MIN_KV_BLOCKS:
        return None
    counts = k2q_num.reshape(-1).to(torch.int32)
    top = counts.max().clamp(min=1)
    width = (top + ORDER_NUM_BINS - 1) // ORDER_NUM_BINS
    bins = torch.div(counts, width, rounding_mode="floor")
    return torch.sort(bins, descending=True, stable=True).indices.to(torch.int32)


def emulate_main(q, k, v, dout, lse2, delta, k2q_idx, k2q_num, kv_block_sizes, sm_scale: float):
    """A torch model of the main kernel's math, the spec the tcgen05 kernel is held to.

    Dense ``[B, H, S, S]`` (tests only). Per kv block ``j`` and q block ``i`` in ``j``'s k2q list:
    ``S^T = K Q^T``, ``P^T = exp2(S^T * sm_scale * log2e - lse2)`` with keys at or past
    ``kv_block_sizes[j]`` set to 0 by selection, ``dV += P^T dO``, ``dP^T = V dO^T`` (padded V rows
    zeroed first), ``dS^T = P^T * (dP^T - delta)``, ``dK += dS^T Q`` (times ``sm_scale`` at the end),
    ``dQ_accum += dS K`` (padded K rows zeroed: 0 * NaN would leak). Returns ``(dq_accum fp32, dk,
    dv fp32)``; dk/dv rows of padded keys exactly 0."""
    batch, heads, seq, _ = q.shape
    nb = kv_block_sizes.numel()
    dev = q.device
    used = torch.arange(k2q_idx.shape[-1], device=dev) < k2q_num[..., None].to(torch.int64)
    # Unused slots scatter into a spare trailing column, dropped afterwards.
    target = torch.where(used, k2q_idx.to(torch.int64), torch.full((), nb, dtype=torch.int64, device=dev))
    sel = torch.zeros((batch, heads, nb, nb + 1), dtype=torch.bool, device=dev)
    sel.scatter_(-1, target, True)
    sel = sel[..., :nb]  # [.., kv block, q block]
    pos = torch.arange(BLOCK, device=dev)
    kv_valid = (pos[None, :] < kv_block_sizes.to(dev).to(torch.int64)[:, None]).reshape(-1)  # [S]
    mask_t = sel.repeat_interleave(BLOCK, dim=-2).repeat_interleave(BLOCK, dim=-1) & kv_valid[:, None]  # [kv tok, q tok]
    kf = torch.where(kv_valid[:, None], k.float(), 0.0)
    vf = torch.where(kv_valid[:, None], v.float(), 0.0)
    qf, dof = q.float(), dout.float()
    st = kf @ qf.transpose(-1, -2)
    pt = torch.exp2(st * (sm_scale * LOG2E) - lse2[..., None, :])
    pt = torch.where(mask_t, pt, 0.0)
    dv = pt @ dof
    dpt = vf @ dof.transpose(-1, -2)
    dst = pt * (dpt - delta[..., None, :])
    dk = (dst @ qf) * sm_scale
    dq_accum = dst.transpose(-1, -2) @ kf
    return dq_accum, dk, dv


def _warn_unverified() -> None:
    warnings.warn(
        "fastvideo_cute: the CuTe DSL sm_100a VSA backward runs by explicit opt-in and has not yet "
        "passed its GPU tests on a compute-capability 10.x device", RuntimeWarning, stacklevel=3)


def compiled_main(arch: str = "sm_100a"):
    """The tcgen05 main kernel compiled (TVM-FFI) for ``arch`` through :mod:`fastvideo_cute.jit`."""
    return _kernels.main_kernel().compile(arch)


def sm100_block_sparse_bwd64(q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes,
                             sm_scale: Optional[float] = None, allow_unverified: Optional[bool] = None):
    """The whole backward; returns ``(dq, dk, dv)``, bf16 ``[B, H, S, 128]`` (see the module docstring).

    ``k2q_idx`` entries must be valid q block ids in ``[0, nb)`` for the first ``k2q_num`` slots (what
    ``invert_indices`` produces; they are not range-checked on the device). Raises ``ValueError``
    naming the reason when :func:`sm100_bwd64_support` refuses, ``RuntimeError`` without the opt-in
    (``allow_unverified=True`` or ``FASTVIDEO_CUTE_SM100_BWD=1``): the kernel has not yet passed its
    tests on a compute-capability 10.x GPU."""
    ok, reason = sm100_bwd64_support(q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes)
    if not ok:
        raise ValueError(f"sm100_block_sparse_bwd64: {reason}")
    if allow_unverified is None:
        allow_unverified = os.environ.get(OPT_IN_ENV, "") == "1"
    if not allow_unverified:
        raise RuntimeError(f"sm100_block_sparse_bwd64 is unverified on hardware: opt in with {OPT_IN_ENV}=1")
    _warn_unverified()
    if sm_scale is None:
        sm_scale = HEAD_DIM**-0.5
    if not math.isfinite(sm_scale):
        raise ValueError("sm100_block_sparse_bwd64: sm_scale must be finite")
    fn = compiled_main(MAIN_CAPABILITIES[torch.cuda.get_device_capability(q.device)]) if q.numel() else None
    return run_bwd64_chain(fn, q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes, sm_scale)


def run_bwd64_chain(main_fn, q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes, sm_scale: float,
                    order_policy: str = "auto", frag_order: bool = False):
    """Stages 1-4 around a compiled main kernel ``main_fn`` (the tcgen05 or the wgmma one: both take
    ``(q2d, k2d, v2d, do2d, dk2d, dv2d, dqacc2d, lse2, delta, idx2d, num, vbs, order, sm_scale)``);
    the inputs were checked by the caller's support predicate. ``order_policy``: "auto" (stage 2's
    :func:`work_order`) or "identity" (CTA = item: neighbouring kv blocks of one head run together,
    so the q blocks they reduce dQ into and read Q/dO from are one head's); ``frag_order``: the main
    kernel leaves dq_accum's tiles in its register order (the Hopper kernels' flat staging: the
    matching postprocess). Returns ``(dq, dk, dv)``."""
    if order_policy not in ORDER_POLICIES:
        raise ValueError(f"order_policy must be one of {ORDER_POLICIES}, got {order_policy!r}")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0:
        return dq, dk, dv
    batch, heads, _, _ = q.shape
    nb = kv_block_sizes.numel()
    items = batch * heads * nb
    common = sm100_bwd64_common_stages(out, dout, lse, k2q_num, kv_block_sizes, dk=dk, dv=dv)
    order = common["order"] if order_policy == "auto" else None
    if order is None:
        order = torch.arange(items, dtype=torch.int32, device=q.device)
    idx = k2q_idx.to(torch.int32).reshape(items, k2q_idx.shape[-1]).contiguous()
    num = k2q_num.to(torch.int32).reshape(items).contiguous()
    vbs = kv_block_sizes.to(torch.int32).contiguous()
    dq_accum = common["dq_accum"]
    with torch.cuda.device(q.device):
        main_fn(q.view(-1, HEAD_DIM), k.view(-1, HEAD_DIM), v.view(-1, HEAD_DIM), dout.view(-1, HEAD_DIM),
                dk.view(-1, HEAD_DIM), dv.view(-1, HEAD_DIM), dq_accum.view(-1, HEAD_DIM),
                common["lse2"].view(-1), common["delta"].view(-1), idx, num, vbs, order, float(sm_scale))
    sm100_bwd64_postprocess(dq_accum, lse, sm_scale, dq=dq, frag_order=frag_order)
    return dq, dk, dv
