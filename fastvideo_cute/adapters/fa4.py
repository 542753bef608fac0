"""FlashAttention-4 (CuTe DSL) block-sparse adapter for VSA.

VSA describes block-sparse attention with a *logical* block map (``[B, H, Qb, KVb]`` bool,
``block_size`` tokens per block on both axes) and ``kv_block_sizes`` (valid leading tokens per
kv block). FA4's block sparsity wants, per *physical* tile, index lists of the tiles to visit,
split into FULL tiles (no masking) and PARTIAL tiles (a ``mask_mod`` decides per element).
This module does that translation, on the torch side only, and calls FA4's private
``_flash_attn_fwd`` / ``_flash_attn_bwd`` (the public ``flash_attn_func`` hides the tile and
q-stage choices this adapter has to make).

Pinned stack: ``flash-attn-4==4.0.0b36``, ``nvidia-cutlass-dsl==4.8.1``,
``quack-kernels==0.6.5``. FA4 is imported lazily (:func:`load_fa4`); importing this module does
not import it, so the predicate and the metadata builders work without FA4.

Tile decisions (all exact: a physical q tile never spans two logical q blocks, and a physical
kv tile never spans two logical kv blocks):

============  ====================================  ==========================================
arch          forward                               backward
============  ====================================  ==========================================
sm_90         tile 128x128, sparse q block = L,     tile (64|128)x128 (FA4's
              kv tiles of 128 (L=256 split in 2);   ``_tile_size_bwd_sm90``), sparse q block = L,
              L=64: tile 64x64, kv tiles of 64      kv tiles of 128; L=64: not served (FA4's
                                                    sm_90 backward needs 128-wide kv tiles)
sm_100        tile 128x128, kv tiles of 128;        tile 128x128, 1-CTA, sparse q block = L,
              L=256: two Q stages (q block 256);    kv tiles of 128
              L=128: ONE Q stage (see
              ``_SingleQStageSeqlen``); L=64: not
              served (a 128-row q tile would span
              two logical blocks)
============  ====================================  ==========================================

Empty rows. A q tile whose lists are both empty (nothing selected, or every selected kv tile
has size 0, which the builder drops) takes FA4's empty-tile path: sm_90
(``flash_fwd_sm90.py``) resets the softmax stats and zero-fills the accumulator, so
``row_sum == 0`` and ``finalize`` writes ``lse = -inf``; sm_100
(``block_sparse_utils.handle_block_sparse_empty_tile_correction_sm100``) seeds
``row_sum = 1, row_max = -inf`` and writes the tile with scale 0, so ``lse = -inf * scale + 0
= -inf``. Both write ``out = 0``: the library's contract already, so no conversion pass is
needed (``tests/adapters/test_fa4_gpu.py`` checks it on the GPU). A row of a PARTIAL tile always
keeps at least one key (the mask depends on the key index only and a partial tile has
``size > 0``), so no visited row is fully masked. FA4's LSE is natural log (it multiplies the
log2 value by ln 2), ``[B, H, Sq]`` fp32: the library's contract as is.
"""

from __future__ import annotations

from typing import Optional

import torch

from .fa4_metadata import FA4Metadata, FA4SparseIndex, build_bwd_metadata, build_fwd_metadata
from .fa4_plan import (FA4_BLOCK_SIZES, FA4_DTYPES, FA4Plan, FA4UnsupportedError, SingleQStageSeqlen, fa4_bwd_plan,
                       fa4_fwd_plan, fa4_support, sm90_bwd_tile_m)
from .fa4_stack import FA4_JIT_SYMPTOMS, FA4_PINS, fa4_arch, fa4_version_problems, load_fa4

# Kept for callers of the old private names.
_sm90_bwd_tile_m = sm90_bwd_tile_m
_SingleQStageSeqlen = SingleQStageSeqlen

__all__ = [
    "FA4_PINS",
    "FA4UnsupportedError",
    "FA4Plan",
    "FA4SparseIndex",
    "FA4Metadata",
    "FA4_JIT_SYMPTOMS",
    "load_fa4",
    "fa4_version_problems",
    "fa4_arch",
    "fa4_support",
    "fa4_fwd_plan",
    "fa4_bwd_plan",
    "build_fwd_metadata",
    "build_bwd_metadata",
    "fa4_block_sparse_fwd",
    "fa4_block_sparse_bwd",
    "fa4_block_sparse_fwd_prebuilt",
    "fa4_block_sparse_bwd_prebuilt",
    "zeroed_kv_padding",
]

# ----------------------------------------------------------------------------------------------
# Argument checks
# ----------------------------------------------------------------------------------------------


def _check_block_size(block_size) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in FA4_BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {FA4_BLOCK_SIZES}, got {block_size!r}")
    return block_size


def _check_4d(name: str, t, dims: str = "[B, S, H, D]") -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must be 4-D BSHD {dims}, got shape {tuple(t.shape)}")


def _check_qkv(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_4d(name, t)
        if t.dtype not in FA4_DTYPES:
            raise ValueError(f"{name} must be float16 or bfloat16, got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last (head_dim) dimension, got strides {t.stride()}")
    b, sq, h, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if k.shape[0] != b or k.shape[2] != h or k.shape[3] != d:
        raise ValueError(f"k/v must be [B={b}, Skv, H={h}, D={d}] to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    return b, sq, k.shape[1], h, d


def _check_map_and_sizes(block_map, kv_block_sizes, b, h, sq, skv, block_size):
    if not isinstance(block_map, torch.Tensor):
        raise ValueError(f"block_map must be a torch.Tensor, got {type(block_map).__name__}")
    if block_map.dim() == 3:
        block_map = block_map.unsqueeze(0)
    if block_map.dim() != 4:
        raise ValueError(f"block_map must be [B, H, Qb, KVb] (or [H, Qb, KVb]), got shape {tuple(block_map.shape)}")
    if block_map.dtype.is_floating_point or block_map.dtype.is_complex:
        raise ValueError(f"block_map must be bool (or an integer 0/1 map), got {block_map.dtype}")
    if sq % block_size or skv % block_size:
        raise ValueError(f"q length {sq} and kv length {skv} must be multiples of block_size={block_size}")
    qb, kvb = sq // block_size, skv // block_size
    if block_map.shape[0] not in (1, b) or block_map.shape[1] != h or tuple(block_map.shape[2:]) != (qb, kvb):
        raise ValueError(f"block_map must be [B={b}, H={h}, Qb={qb}, KVb={kvb}] for q length {sq}, kv length "
                         f"{skv} and block_size={block_size}; got {tuple(block_map.shape)}")
    if block_map.shape[0] != b:
        block_map = block_map.expand(b, -1, -1, -1)
    if not isinstance(kv_block_sizes, torch.Tensor):
        raise ValueError(f"kv_block_sizes must be a torch.Tensor, got {type(kv_block_sizes).__name__}")
    if kv_block_sizes.dim() != 1 or kv_block_sizes.numel() != kvb:
        raise ValueError(f"kv_block_sizes must be 1-D with KVb={kvb} entries, got shape {tuple(kv_block_sizes.shape)}")
    if kv_block_sizes.dtype.is_floating_point or kv_block_sizes.dtype.is_complex or kv_block_sizes.dtype == torch.bool:
        raise ValueError(f"kv_block_sizes must be an integer tensor (int32), got {kv_block_sizes.dtype}")
    return block_map, kv_block_sizes


def _require_support(q_dtype, head_dim, block_size, need_grad):
    arch = fa4_arch()
    ok, reason = fa4_support(arch, q_dtype, head_dim, block_size, block_size, need_grad)
    if not ok:
        raise FA4UnsupportedError(f"FA4 route cannot serve this call: {reason}")
    return arch


# ----------------------------------------------------------------------------------------------
# Forward / backward
# ----------------------------------------------------------------------------------------------


def zeroed_kv_padding(k: Optional[torch.Tensor], v: torch.Tensor, meta: FA4Metadata):
    """Out-of-place copies of k/v with the padded tail of every kv tile set to 0 (``k`` None: V
    only, and k comes back None).

    Needed only when padded keys may hold NaN/Inf: FA4 reads a PARTIAL tile whole, and although
    the mask_mod turns the padded scores into -inf by select (so P = 0 there, whatever K holds),
    ``P @ V`` still computes ``0 * NaN = NaN`` in the forward, and the backward's
    ``dS = P * (dO V^T - delta)`` and ``dQ = dS K`` do the same with NaN/Inf in V or K. So the
    forward zeroes V alone and the backward both. Finite padding (e.g. the zeros the tiling
    writes) needs nothing. On CUDA one fused Triton launch (``kernels/triton/sanitize_padding``:
    padded rows are never read); elsewhere ``torch.where``.
    """
    kv_tile = meta.plan.kv_tile
    sizes = meta.kv_tile_sizes.to(device=v.device, dtype=torch.int32).contiguous()
    if v.is_cuda:
        from ..kernels.triton.sanitize_padding import sanitize_kv_padding

        return sanitize_kv_padding(k, v, sizes, kv_tile, bshd=True)
    pos = torch.arange(kv_tile, device=v.device, dtype=torch.int32)
    valid = (pos[None, :] < sizes[:, None]).reshape(1, -1, 1, 1)
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    return (None if k is None else torch.where(valid, k, zero)), torch.where(valid, v, zero)


def _to_fa4(fa, index: FA4SparseIndex):
    return fa.BlockSparseTensorsTorch(
        mask_block_cnt=index.mask_cnt,
        mask_block_idx=index.mask_idx,
        full_block_cnt=index.full_cnt,
        full_block_idx=index.full_idx,
        block_size=tuple(index.block_size),
    )


def fa4_block_sparse_fwd_prebuilt(q, k, v, meta: FA4Metadata, *, softmax_scale: Optional[float] = None,
                                  out: Optional[torch.Tensor] = None):
    """FA4 forward with metadata from :func:`build_fwd_metadata` (no checks: the kernel only).
    ``out``: a caller-allocated BSHD output, any strides with a contiguous last dim (e.g. the
    ``transpose(1, 2)`` view of a BHSD tensor, so a BHSD caller needs no copy afterwards)."""
    fa = load_fa4()
    plan = meta.plan
    max_seqlen_q = SingleQStageSeqlen(q.shape[1]) if plan.single_q_stage else None
    out, lse = fa.fwd(
        q, k, v,
        softmax_scale=softmax_scale,
        causal=False,
        tile_mn=plan.tile_mn,
        max_seqlen_q=max_seqlen_q,
        mask_mod=fa.mask_mod(plan.kv_tile),
        block_sparse_tensors=_to_fa4(fa, meta.index),
        aux_tensors=[meta.kv_tile_sizes],
        return_lse=True,
        out=out,
    )[:2]
    return out, lse


def fa4_block_sparse_bwd_prebuilt(q, k, v, out, dout, lse, meta: FA4Metadata, *,
                                  softmax_scale: Optional[float] = None, dq=None, dk=None, dv=None):
    """FA4 backward with metadata from :func:`build_bwd_metadata` (no checks: the kernels only).
    ``dq`` / ``dk`` / ``dv``: caller-allocated BSHD gradients, any strides with a contiguous last
    dim (e.g. the ``transpose(1, 2)`` views of BHSD tensors), written in place and returned; None:
    FA4 allocates them ``empty_like`` its q / k / v."""
    fa = load_fa4()
    grads = fa.bwd(
        q, k, v, out, dout, lse,
        softmax_scale=softmax_scale,
        causal=False,
        mask_mod=fa.mask_mod(meta.plan.kv_tile),
        aux_tensors=[meta.kv_tile_sizes],
        block_sparse_tensors=_to_fa4(fa, meta.index),
        dq=dq, dk=dk, dv=dv,
    )
    return grads[0], grads[1], grads[2]


def fa4_block_sparse_fwd(q, k, v, block_map, kv_block_sizes, *, block_size: int, need_backward: bool,
                         softmax_scale: Optional[float] = None, zero_kv_padding: bool = False,
                         all_full: bool = False):
    """Block-sparse attention forward through FA4. BSHD in, ``(out BSHD, lse [B, H, Sq] fp32 ln)`` out.

    ``need_backward`` only checks, up front, that :func:`fa4_block_sparse_bwd` will be able to
    serve the backward of this call; the forward itself is identical either way (the backward
    metadata is built by :func:`fa4_block_sparse_bwd`, never here).
    ``zero_kv_padding``: set it when padded keys (positions at or past ``kv_block_sizes``) may
    hold NaN/Inf; see :func:`zeroed_kv_padding` (FA4 would otherwise return NaN rows).
    ``all_full``: the caller's promise that every kv block is full (sizes == block_size), e.g.
    from a cached range check; the partial lists are then empty and not built. A false promise
    gives wrong results, so only pass what was checked.
    q/k/v may be strided BSHD views (e.g. ``x_bhsd.transpose(1, 2)``): FA4 takes any layout
    whose last dim is contiguous and whose strides are 16-byte aligned, without a copy.
    """
    block_size = _check_block_size(block_size)
    b, sq, skv, h, d = _check_qkv(q, k, v)
    block_map, kv_block_sizes = _check_map_and_sizes(block_map, kv_block_sizes, b, h, sq, skv, block_size)
    arch = _require_support(q.dtype, d, block_size, bool(need_backward))
    meta = build_fwd_metadata(block_map, kv_block_sizes, fa4_fwd_plan(arch, block_size), all_full)
    if zero_kv_padding and not all_full:
        _, v = zeroed_kv_padding(None, v, meta)  # K's padding cannot leak in the forward
    return fa4_block_sparse_fwd_prebuilt(q, k, v, meta, softmax_scale=softmax_scale)


def fa4_block_sparse_bwd(q, k, v, out, dout, lse, block_map, kv_block_sizes, *, block_size: int,
                         softmax_scale: Optional[float] = None, zero_kv_padding: bool = False,
                         all_full: bool = False):
    """Backward of :func:`fa4_block_sparse_fwd`: ``(dq, dk, dv)``, each shaped like its input.

    Builds the KV-owned lists (only here). dk/dv of padded keys come out 0. Pass the same
    ``zero_kv_padding`` as the forward.
    """
    block_size = _check_block_size(block_size)
    b, sq, skv, h, d = _check_qkv(q, k, v)
    _check_4d("out", out)
    _check_4d("dout", dout)
    if out.shape != q.shape:
        raise ValueError(f"out must have q's shape {tuple(q.shape)}, got {tuple(out.shape)}")
    if dout.shape != q.shape:
        raise ValueError(f"dout must have q's shape {tuple(q.shape)}, got {tuple(dout.shape)}")
    if out.dtype != q.dtype or dout.dtype != q.dtype:
        raise ValueError(f"out and dout must be {q.dtype}, got {out.dtype} and {dout.dtype}")
    if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != (b, h, sq) or lse.dtype != torch.float32:
        got = f"{tuple(lse.shape)} {lse.dtype}" if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise ValueError(f"lse must be float32 [B={b}, H={h}, Sq={sq}], got {got}")
    block_map, kv_block_sizes = _check_map_and_sizes(block_map, kv_block_sizes, b, h, sq, skv, block_size)
    arch = _require_support(q.dtype, d, block_size, True)
    meta = build_bwd_metadata(block_map, kv_block_sizes, fa4_bwd_plan(arch, block_size), all_full)
    if zero_kv_padding and not all_full:
        k, v = zeroed_kv_padding(k, v, meta)
    return fa4_block_sparse_bwd_prebuilt(q, k, v, out, dout, lse, meta, softmax_scale=softmax_scale)
