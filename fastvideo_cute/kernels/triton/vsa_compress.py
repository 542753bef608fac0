"""Fused VSA compression: block means of q, k and v in one launch, and its backward.

Forward (``vsa_compress_fwd``): ``xc[b, h, n] = sum(x[b, h, n*BLOCK + t] for t < size[n]) / max(size[n], 1)``
for x in (q, k, v), fp32 out ``[B, H, n, D]`` (contiguous), fp16/bf16/fp32 in. q uses the q sizes,
k and v the kv sizes; tokens at or past a block's size are never loaded (masked loads), so padding
may hold anything, NaN included. Grid ``(max(Qb, KVb), B * H)``: program ``(n, bh)`` reduces q
block ``n`` (if ``n < Qb``) and k, v blocks ``n`` (if ``n < KVb``), walking each block's valid
tokens in ``BLOCK_T``-token chunks with an fp32 accumulator. The mean is a correctly rounded
division (``div_rn``), as torch's. ``config=`` (tuning): one program per tensor and block
("split"), all three tiles loaded before the first sum ("preload"), a cache hint: the same bits.

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

__all__ = ["vsa_compress_fwd", "vsa_compress_bwd", "COMPRESS_MODES"]


@triton.jit
def _block_mean(X, SIZES, XC, stride_b, stride_h, stride_s, off_b, off_h, bh, n, nblk, D,
                BLOCK: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, EVICT: tl.constexpr,
                XO=None, so_b=0, so_h=0, so_s=0, WRITE: tl.constexpr = False):
    """Block ``n``'s mean into ``XC``; with ``WRITE``, also the block copied to ``XO`` with its
    padding rows (``t >= size``) zeroed (the valid rows are the ones loaded for the sum)."""
    size = tl.load(SIZES + n)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    base = X + off_b * stride_b + off_h * stride_h + (n.to(tl.int64) * BLOCK) * stride_s
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for t0 in range(0, size, BLOCK_T):  # valid tokens only; the last chunk is masked
        tok = t0 + offs_t
        m = (tok < size)[:, None] & dmask[None, :]
        x = tl.load(base + tok.to(tl.int64)[:, None] * stride_s + offs_d[None, :], mask=m, other=0.0,
                    eviction_policy=EVICT)
        acc += tl.sum(x.to(tl.float32), axis=0)
        if WRITE:
            obase = XO + off_b * so_b + off_h * so_h + (n.to(tl.int64) * BLOCK) * so_s
            tl.store(obase + tok.to(tl.int64)[:, None] * so_s + offs_d[None, :], x, mask=m)
    mean = tl.math.div_rn(acc, tl.maximum(size, 1).to(tl.float32))
    tl.store(XC + (bh.to(tl.int64) * nblk + n) * D + offs_d, mean, mask=dmask)
    if WRITE:
        obase = XO + off_b * so_b + off_h * so_h + (n.to(tl.int64) * BLOCK) * so_s
        for t0 in range((size // BLOCK_T) * BLOCK_T, BLOCK, BLOCK_T):  # the padding rows: zeros
            tok = t0 + offs_t
            pm = ((tok >= size) & (tok < BLOCK))[:, None] & dmask[None, :]
            tl.store(obase + tok.to(tl.int64)[:, None] * so_s + offs_d[None, :],
                     tl.zeros([BLOCK_T, BLOCK_D], dtype=XO.dtype.element_ty), mask=pm)


@triton.jit
def _load_block(X, SIZES, stride_b, stride_h, stride_s, off_b, off_h, n, nblk, D,
                BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, EVICT: tl.constexpr):
    """Block ``n``'s valid tokens as one ``[BLOCK, BLOCK_D]`` tile (0 elsewhere; all 0 when
    ``n >= nblk``), and its size."""
    size = tl.load(SIZES + n, mask=n < nblk, other=0)
    tok = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    base = X + off_b * stride_b + off_h * stride_h + (n.to(tl.int64) * BLOCK) * stride_s
    m = (tok < size)[:, None] & (offs_d < D)[None, :]
    x = tl.load(base + tok.to(tl.int64)[:, None] * stride_s + offs_d[None, :], mask=m, other=0.0,
                eviction_policy=EVICT)
    return x, size


@triton.jit
def _store_mean(x, size, XC, bh, n, nblk, D, BLOCK_D: tl.constexpr):
    # acc = 0 + sum: the same operations as _block_mean's one-chunk loop (-0.0 sums become +0.0)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc += tl.sum(x.to(tl.float32), axis=0)
    offs_d = tl.arange(0, BLOCK_D)
    mean = tl.math.div_rn(acc, tl.maximum(size, 1).to(tl.float32))
    tl.store(XC + (bh.to(tl.int64) * nblk + n) * D + offs_d, mean, mask=offs_d < tl.where(n < nblk, D, 0))


@triton.jit
def _vsa_compress_fwd_kernel(
    Q, K, V, Q_SIZES, KV_SIZES, QC, KC, VC, KO, VO,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_kob, stride_koh, stride_kos,
    stride_vob, stride_voh, stride_vos,
    H, Qb, KVb, D,
    BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    MODE: tl.constexpr,
    EVICT: tl.constexpr,
    WRITE_K: tl.constexpr = False,
    WRITE_V: tl.constexpr = False,
):
    """MODE "fused": program (n, bh) reduces q, k, v block n in turn (today's kernel). "split":
    grid axis 2 picks q, k or v (three times the programs, one block each). "preload" (needs
    BLOCK_T == BLOCK): the three tiles are loaded before the first sum. Every mode reduces a block
    with the same chunking and sum, so the same bits. ``WRITE_K`` / ``WRITE_V`` ("fused" and
    "split"): k / v also copied to ``KO`` / ``VO`` with their padding rows zeroed."""
    n = tl.program_id(0)
    bh = tl.program_id(1)
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    if MODE == "fused":
        if n < Qb:
            _block_mean(Q, Q_SIZES, QC, stride_qb, stride_qh, stride_qs, off_b, off_h, bh, n, Qb, D,
                        BLOCK, BLOCK_T, BLOCK_D, EVICT)
        if n < KVb:
            _block_mean(K, KV_SIZES, KC, stride_kb, stride_kh, stride_ks, off_b, off_h, bh, n, KVb, D,
                        BLOCK, BLOCK_T, BLOCK_D, EVICT, KO, stride_kob, stride_koh, stride_kos, WRITE_K)
            _block_mean(V, KV_SIZES, VC, stride_vb, stride_vh, stride_vs, off_b, off_h, bh, n, KVb, D,
                        BLOCK, BLOCK_T, BLOCK_D, EVICT, VO, stride_vob, stride_voh, stride_vos, WRITE_V)
    elif MODE == "split":
        which = tl.program_id(2)
        if which == 0:
            if n < Qb:
                _block_mean(Q, Q_SIZES, QC, stride_qb, stride_qh, stride_qs, off_b, off_h, bh, n, Qb, D,
                            BLOCK, BLOCK_T, BLOCK_D, EVICT)
        elif which == 1:
            if n < KVb:
                _block_mean(K, KV_SIZES, KC, stride_kb, stride_kh, stride_ks, off_b, off_h, bh, n, KVb, D,
                            BLOCK, BLOCK_T, BLOCK_D, EVICT, KO, stride_kob, stride_koh, stride_kos, WRITE_K)
        else:
            if n < KVb:
                _block_mean(V, KV_SIZES, VC, stride_vb, stride_vh, stride_vs, off_b, off_h, bh, n, KVb, D,
                            BLOCK, BLOCK_T, BLOCK_D, EVICT, VO, stride_vob, stride_voh, stride_vos, WRITE_V)
    else:  # "preload"
        xq, sq = _load_block(Q, Q_SIZES, stride_qb, stride_qh, stride_qs, off_b, off_h, n, Qb, D, BLOCK, BLOCK_D, EVICT)
        xk, sk = _load_block(K, KV_SIZES, stride_kb, stride_kh, stride_ks, off_b, off_h, n, KVb, D, BLOCK, BLOCK_D,
                             EVICT)
        xv, sv = _load_block(V, KV_SIZES, stride_vb, stride_vh, stride_vs, off_b, off_h, n, KVb, D, BLOCK, BLOCK_D,
                             EVICT)
        _store_mean(xq, sq, QC, bh, n, Qb, D, BLOCK_D)
        _store_mean(xk, sk, KC, bh, n, KVb, D, BLOCK_D)
        _store_mean(xv, sv, VC, bh, n, KVb, D, BLOCK_D)


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


def vsa_compress_fwd(q, k, v, q_sizes, kv_sizes, qc, kc, vc, *, block: int, config=None, k_out=None,
                     v_out=None) -> None:
    """Block means of BHSD ``q [B,H,Sq,D]``, ``k``/``v [B,H,Skv,D]`` into caller-allocated fp32
    ``qc [B,H,Sq/block,D]``, ``kc``/``vc [B,H,Skv/block,D]`` (contiguous). ``q_sizes``/``kv_sizes``:
    contiguous int32 valid-token counts per block, in ``[0, block]`` (not checked here).

    ``config`` (tuning; None: today's kernel): dict of ``mode`` (:data:`COMPRESS_MODES`: the
    program split; same bits), ``evict_first`` (a cache hint; same bits), ``block_t`` /
    ``num_warps`` (the chunk and the thread layout of each block's sum: a different summation
    tree, so possibly other last bits: the benchmark checks).

    ``k_out`` / ``v_out`` (BHSD like ``k``, any strides with last stride 1, ``k``'s dtype): also
    write k / v there with every padding row (``t >= size``) zeroed, in the same pass (what the
    cuDNN / FA4 routes otherwise make with a separate sanitize launch); not with mode "preload"."""
    B, H, Sq, D = check_bhsd("q", q)
    Skv = check_bhsd("k", k, B, H, None, D)[2]
    check_bhsd("v", v, B, H, Skv, D)
    assert Sq % block == 0 and Skv % block == 0, "sequence lengths must be multiples of block"
    Qb, KVb = Sq // block, Skv // block
    _check_sizes("q_sizes", q_sizes, Qb)
    _check_sizes("kv_sizes", kv_sizes, KVb)
    for name, xc, n in (("qc", qc, Qb), ("kc", kc, KVb), ("vc", vc, KVb)):
        _check_means(name, xc, B, H, n, D)
    block_t, block_d, warps, mode, evict = _fwd_config(config, block, D)
    for name, out in (("k_out", k_out), ("v_out", v_out)):
        if out is not None:
            check_bhsd(name, out, B, H, Skv, D)
            assert dtype_name(out) == dtype_name(k), f"{name} must have k's dtype"
            assert mode != "preload", f"{name} needs mode 'fused' or 'split'"

    def strides(x):
        return (x.stride(0), x.stride(1), x.stride(2)) if x is not None else (0, 0, 0)

    grid = (max(Qb, KVb), B * H, 3 if mode == "split" else 1)
    _vsa_compress_fwd_kernel[grid](
        q, k, v, q_sizes, kv_sizes, qc, kc, vc, k_out if k_out is not None else k, v_out if v_out is not None else v,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        *strides(k_out), *strides(v_out),
        H, Qb, KVb, D,
        BLOCK=block, BLOCK_T=block_t, BLOCK_D=block_d, MODE=mode, EVICT=evict,
        WRITE_K=k_out is not None, WRITE_V=v_out is not None,
        num_warps=warps,
    )


COMPRESS_MODES = ("fused", "split", "preload")


def _fwd_config(config, block, head_dim):
    """(BLOCK_T, BLOCK_D, num_warps, MODE, eviction policy) from ``config`` (a dict with any of
    ``block_t``, ``num_warps``, ``mode``, ``evict_first``; None: today's kernel)."""
    block_t, block_d = token_tile(block, head_dim)
    if config is None:
        return block_t, block_d, 4, "fused", ""
    cfg = dict(config)
    unknown = set(cfg) - {"block_t", "num_warps", "mode", "evict_first"}
    if unknown:
        raise ValueError(f"config: unknown keys {sorted(unknown)}")
    block_t = int(cfg.get("block_t", block_t))
    warps = int(cfg.get("num_warps", 4))
    mode = cfg.get("mode", "fused")
    if mode not in COMPRESS_MODES:
        raise ValueError(f"config: mode must be one of {COMPRESS_MODES}, got {mode!r}")
    if block_t < 1 or block_t & (block_t - 1) or block_t > block or block % block_t:
        raise ValueError(f"config: block_t={block_t} must be a power of two dividing block {block}")
    if mode == "preload" and block_t != block:
        raise ValueError(f"config: mode 'preload' reads a block in one chunk (block_t == block {block})")
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"config: num_warps={warps} must be one of 1, 2, 4, 8, 16")
    return block_t, block_d, warps, mode, "evict_first" if cfg.get("evict_first") else ""


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
