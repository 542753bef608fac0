"""Fused VSA compression: block means of q, k and v in one launch, and its backward.

Forward (``vsa_compress_fwd``): ``xc[b, h, n] = sum(x[b, h, n*BLOCK + t] for t < size[n]) / max(size[n], 1)``
for x in (q, k, v), fp32 out ``[B, H, n, D]`` (contiguous), fp16/bf16/fp32 in. q uses the q sizes,
k and v the kv sizes; tokens at or past a block's size are never loaded (masked loads), so padding
may hold anything, NaN included. Grid ``(max(Qb, KVb), B * H)``: program ``(n, bh)`` reduces q
block ``n`` (if ``n < Qb``) and k, v blocks ``n`` (if ``n < KVb``), walking each block's valid
tokens in ``BLOCK_T``-token chunks with an fp32 accumulator. The mean is a correctly rounded
division (``div_rn``), as torch's.

Backward (``vsa_compress_bwd``): the mean's gradient spread over the valid tokens,
``dx[b, h, n*BLOCK + t] = dxc[b, h, n] / max(size[n], 1)`` for ``t < size[n]``. Same grid. Two modes:

- ``accumulate=False``: write every token of dq/dk/dv (padding tokens get exact 0);
- ``accumulate=True``: read-add-write the valid tokens only, in place, into grad tensors that
  already hold another branch's gradient (padding tokens are not touched). Each element is
  written by one program: no atomics, deterministic.

Tensors are BHSD views with any strides (last stride 1): a BSHD tensor is passed as its
``transpose(1, 2)`` view, no copy. Any head_dim (a power-of-two ``BLOCK_D`` lane count with masked
lanes). The launch helpers check shapes and write into caller-allocated outputs; they launch on the
current CUDA device (the caller sets it). This module does not import torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .vsa_common import check_bhsd, dtype_name, token_tile

__all__ = ["vsa_compress_fwd", "vsa_compress_bwd"]


@triton.jit
def _block_mean(X, SIZES, XC, stride_b, stride_h, stride_s, off_b, off_h, bh, n, nblk, D,
                BLOCK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    size = tl.load(SIZES + n)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    base = X + off_b * stride_b + off_h * stride_h + (n.to(tl.int64) * BLOCK) * stride_s
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for t0 in range(0, size, BLOCK_T):  # valid tokens only; the last chunk is masked
        tok = t0 + offs_t
        m = (tok < size)[:, None] & dmask[None, :]
        x = tl.load(base + tok.to(tl.int64)[:, None] * stride_s + offs_d[None, :], mask=m, other=0.0)
        acc += tl.sum(x.to(tl.float32), axis=0)
    mean = tl.math.div_rn(acc, tl.maximum(size, 1).to(tl.float32))
    tl.store(XC + (bh.to(tl.int64) * nblk + n) * D + offs_d, mean, mask=dmask)


@triton.jit
def _vsa_compress_fwd_kernel(
    Q, K, V, Q_SIZES, KV_SIZES, QC, KC, VC,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    H, Qb, KVb, D,
    BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    n = tl.program_id(0)
    bh = tl.program_id(1)
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    if n < Qb:
        _block_mean(Q, Q_SIZES, QC, stride_qb, stride_qh, stride_qs, off_b, off_h, bh, n, Qb, D,
                    BLOCK, BLOCK_T, BLOCK_D)
    if n < KVb:
        _block_mean(K, KV_SIZES, KC, stride_kb, stride_kh, stride_ks, off_b, off_h, bh, n, KVb, D,
                    BLOCK, BLOCK_T, BLOCK_D)
        _block_mean(V, KV_SIZES, VC, stride_vb, stride_vh, stride_vs, off_b, off_h, bh, n, KVb, D,
                    BLOCK, BLOCK_T, BLOCK_D)


@triton.jit
def _block_spread(DXC, SIZES, DX, stride_b, stride_h, stride_s, off_b, off_h, bh, n, nblk, D,
                  BLOCK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                  ACCUMULATE: tl.constexpr):
    size = tl.load(SIZES + n)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    g = tl.load(DXC + (bh.to(tl.int64) * nblk + n) * D + offs_d, mask=dmask, other=0.0).to(tl.float32)
    g = tl.math.div_rn(g, tl.maximum(size, 1).to(tl.float32))
    base = DX + off_b * stride_b + off_h * stride_h + (n.to(tl.int64) * BLOCK) * stride_s
    if ACCUMULATE:
        for t0 in range(0, size, BLOCK_T):  # valid tokens only; padding is left as it is
            tok = t0 + offs_t
            m = (tok < size)[:, None] & dmask[None, :]
            ptrs = base + tok.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
            old = tl.load(ptrs, mask=m, other=0.0).to(tl.float32)
            tl.store(ptrs, (old + g[None, :]).to(DX.dtype.element_ty), mask=m)
    else:
        for t0 in range(0, BLOCK, BLOCK_T):  # every token; padding gets 0
            tok = t0 + offs_t
            valid = (tok < size)[:, None] & dmask[None, :]
            full = (tok < BLOCK)[:, None] & dmask[None, :]
            val = tl.where(valid, g[None, :], 0.0)
            ptrs = base + tok.to(tl.int64)[:, None] * stride_s + offs_d[None, :]
            tl.store(ptrs, val.to(DX.dtype.element_ty), mask=full)


@triton.jit
def _vsa_compress_bwd_kernel(
    DQC, DKC, DVC, Q_SIZES, KV_SIZES, DQ, DK, DV,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    H, Qb, KVb, D,
    BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_Q: tl.constexpr,
    HAS_K: tl.constexpr,
    HAS_V: tl.constexpr,
    ACCUMULATE: tl.constexpr,
):
    n = tl.program_id(0)
    bh = tl.program_id(1)
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    if HAS_Q:
        if n < Qb:
            _block_spread(DQC, Q_SIZES, DQ, stride_qb, stride_qh, stride_qs, off_b, off_h, bh, n, Qb, D,
                          BLOCK, BLOCK_T, BLOCK_D, ACCUMULATE)
    if HAS_K:
        if n < KVb:
            _block_spread(DKC, KV_SIZES, DK, stride_kb, stride_kh, stride_ks, off_b, off_h, bh, n, KVb, D,
                          BLOCK, BLOCK_T, BLOCK_D, ACCUMULATE)
    if HAS_V:
        if n < KVb:
            _block_spread(DVC, KV_SIZES, DV, stride_vb, stride_vh, stride_vs, off_b, off_h, bh, n, KVb, D,
                          BLOCK, BLOCK_T, BLOCK_D, ACCUMULATE)


def _check_means(name, xc, b, h, n, d):
    assert dtype_name(xc) == "float32", f"{name} must be float32"
    assert xc.is_contiguous() and tuple(xc.shape) == (b, h, n, d), f"{name} shape {tuple(xc.shape)}"


def _check_sizes(name, sizes, n):
    assert dtype_name(sizes) == "int32" and sizes.is_contiguous() and tuple(sizes.shape) == (n,), \
        f"{name} must be contiguous int32 [{n}]"


def vsa_compress_fwd(q, k, v, q_sizes, kv_sizes, qc, kc, vc, *, block: int) -> None:
    """Block means of BHSD ``q [B,H,Sq,D]``, ``k``/``v [B,H,Skv,D]`` into caller-allocated fp32
    ``qc [B,H,Sq/block,D]``, ``kc``/``vc [B,H,Skv/block,D]`` (contiguous). ``q_sizes``/``kv_sizes``:
    contiguous int32 valid-token counts per block, in ``[0, block]`` (not checked here)."""
    B, H, Sq, D = check_bhsd("q", q)
    Skv = check_bhsd("k", k, B, H, None, D)[2]
    check_bhsd("v", v, B, H, Skv, D)
    assert Sq % block == 0 and Skv % block == 0, "sequence lengths must be multiples of block"
    Qb, KVb = Sq // block, Skv // block
    _check_sizes("q_sizes", q_sizes, Qb)
    _check_sizes("kv_sizes", kv_sizes, KVb)
    for name, xc, n in (("qc", qc, Qb), ("kc", kc, KVb), ("vc", vc, KVb)):
        _check_means(name, xc, B, H, n, D)
    block_t, block_d = token_tile(block, D)
    _vsa_compress_fwd_kernel[(max(Qb, KVb), B * H)](
        q, k, v, q_sizes, kv_sizes, qc, kc, vc,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        H, Qb, KVb, D,
        BLOCK=block, BLOCK_T=block_t, BLOCK_D=block_d,
        num_warps=4,
    )


def vsa_compress_bwd(dqc, dkc, dvc, q_sizes, kv_sizes, dq, dk, dv, *, block: int, accumulate: bool) -> None:
    """Spread the block means' gradients (fp32 ``[B,H,n,D]``, contiguous) over the valid tokens of
    BHSD ``dq``/``dk``/``dv`` (any float dtype, any strides with last stride 1). A ``(dxc, dx)`` pair
    may be ``(None, None)`` to skip that tensor. ``accumulate=True`` adds into the valid tokens and
    leaves padding alone; ``accumulate=False`` writes every token (padding 0)."""
    pairs = (("dq", dqc, dq), ("dk", dkc, dk), ("dv", dvc, dv))
    for name, g, x in pairs:
        assert (g is None) == (x is None), f"{name} and its mean gradient must both be given or both None"
    present = [x for _, _, x in pairs if x is not None]
    if not present:
        return
    ref = present[0]
    B, H, _, D = ref.shape
    lens = {}
    for name, g, x in pairs:
        if x is not None:
            lens[name] = check_bhsd(name, x, B, H, None, D)[2]
            assert lens[name] % block == 0, f"{name} length must be a multiple of block"
    Qb = q_sizes.numel()
    KVb = kv_sizes.numel()
    _check_sizes("q_sizes", q_sizes, Qb)
    _check_sizes("kv_sizes", kv_sizes, KVb)
    for name, g, x in pairs:
        if x is not None:
            n = Qb if name == "dq" else KVb
            assert lens[name] == n * block, f"{name} has {lens[name]} tokens, sizes give {n * block}"
            _check_means(name + "c", g, B, H, n, D)

    def strides(x):
        return (x.stride(0), x.stride(1), x.stride(2)) if x is not None else (0, 0, 0)

    block_t, block_d = token_tile(block, D)
    dummy_g = dqc if dqc is not None else (dkc if dkc is not None else dvc)
    _vsa_compress_bwd_kernel[(max(Qb, KVb), B * H)](
        dqc if dqc is not None else dummy_g, dkc if dkc is not None else dummy_g,
        dvc if dvc is not None else dummy_g,
        q_sizes, kv_sizes,
        dq if dq is not None else ref, dk if dk is not None else ref, dv if dv is not None else ref,
        *strides(dq), *strides(dk), *strides(dv),
        H, Qb, KVb, D,
        BLOCK=block, BLOCK_T=block_t, BLOCK_D=block_d,
        HAS_Q=dq is not None, HAS_K=dk is not None, HAS_V=dv is not None,
        ACCUMULATE=bool(accumulate),
        num_warps=4,
    )
