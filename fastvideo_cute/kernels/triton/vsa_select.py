"""Fused VSA selection: coarse attention over block means + exact top-k, straight to q2k lists.

Two launches (when ``topk >= KVb`` the first writes no scores and the second only writes
``0..KVb-1``):

1. ``_vsa_coarse_fwd_kernel``, grid ``(cdiv(Qb, BLOCK_Q), B * H)``: a ``BLOCK_Q``-row tile of
   ``qc`` walks all kv blocks in ``BLOCK_KV`` chunks, FlashAttention-style:
   ``s = (qc @ kc^T) * sm_scale`` (fp32: ``input_precision="ieee"`` by default), ``-inf`` for kv
   blocks of size 0; the tile of ``s`` is stored to the ``scores`` scratch ``[B, H, Qb, KVb]`` fp32 (only when a
   top-k is to be taken); an online softmax (log2 domain) accumulates ``out_c = softmax(s) @ vc``.
   Writes ``out_c`` (cast to its dtype), optionally an fp32 copy for the backward, and the natural-
   log row LSE (``-inf`` and ``out_c = 0`` for a row whose kv blocks are all empty).
2. ``_vsa_topk_kernel``, grid ``(B * H * Qb,)``, one row per program, the whole row in one block
   of ``pow2(KVb)`` lanes (``KVb <= MAX_KV_BLOCKS``). Exact top-k, no sort: each score becomes an
   order-preserving int32 key (``-0.0`` and ``+0.0`` the same key, so they tie as floats do; every
   NaN the largest key, so NaN is selected first), a 32-step binary search over the key range finds
   the k-th largest key ``T``, and the selection is every key ``> T`` plus the lowest-index keys
   ``== T`` until there are exactly ``k`` (a running count). That is the set a stable descending
   sort's first ``k`` entries give. A running count over the selection gives each selected block
   its slot: ``q2k_idx[row, :k]`` ascending, ``q2k_num[row] = k``.

Memory: the scores scratch is the only ``[.., Qb, KVb]`` tensor (the caller frees it after the
call); nothing of that size is needed by the backward (``vsa_coarse_bwd.py`` recomputes P from
the LSE). Deterministic: every output element is written by one program, in a fixed order.

Inputs ``qc``, ``kc``, ``vc``: fp32 contiguous ``[B, H, n, D]``; any head_dim (masked lanes).
The launch helper writes into caller-allocated tensors and launches on the current CUDA device.
This module does not import torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .vsa_common import dtype_name, pow2_lanes

__all__ = ["vsa_select_fwd", "vsa_topk", "MAX_KV_BLOCKS", "COARSE_PRECISIONS", "coarse_tiles", "coarse_fwd_tiles"]

# Widest score row the top-k kernel keeps in one block (8 warps x 32 lanes x 64 keys).
MAX_KV_BLOCKS = 16384

# tl.dot input_precision of the coarse attention (fwd and bwd). "ieee" is plain fp32 (FMA, no
# tensor cores): the contract's fp32 scores. "tf32x3" (three TF32 MMAs, ~fp32 accuracy, tensor
# cores) is the candidate to measure if the coarse attention shows up in a profile.
COARSE_PRECISIONS = ("ieee", "tf32x3", "tf32")


@triton.jit
def _vsa_coarse_fwd_kernel(
    QC, KC, VC, KV_SIZES, OUT, OUT32, LSE, SCORES,
    Qb, KVb, D,
    sm_scale,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_SCORES: tl.constexpr,
    WRITE_OUT32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_q = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rmask = rows < Qb
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    offs_c = tl.arange(0, BLOCK_KV)
    q_rows = bh * Qb + rows.to(tl.int64)  # row index into [B*H*Qb]
    qc = tl.load(QC + q_rows[:, None] * D + offs_d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
    kv_base = bh * KVb * D

    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    for c0 in range(0, KVb, BLOCK_KV):
        cols = c0 + offs_c
        cmask = cols < KVb
        size = tl.load(KV_SIZES + cols, mask=cmask, other=0)
        present = size > 0  # out-of-range columns read size 0: absent
        tile = cols.to(tl.int64)[:, None] * D + offs_d[None, :]
        kmask = cmask[:, None] & dmask[None, :]
        kc = tl.load(KC + kv_base + tile, mask=kmask, other=0.0)
        s = tl.dot(qc, tl.trans(kc), input_precision=PRECISION) * sm_scale
        s = tl.where(present[None, :], s, float("-inf"))
        if WRITE_SCORES:
            tl.store(SCORES + q_rows[:, None] * KVb + cols[None, :], s, mask=rmask[:, None] & cmask[None, :])
        s2 = s * 1.4426950408889634  # log2 domain
        m_new = tl.maximum(m_i, tl.max(s2, 1))
        # A row whose blocks so far are all absent keeps m = -inf: subtract 0 instead.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s2 - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        vc = tl.load(VC + kv_base + tile, mask=kmask, other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p, vc, acc, input_precision=PRECISION)
        m_i = m_new

    # l == 0: every kv block empty (out_c 0, lse -inf). A NaN l stays NaN in out_c and lse.
    has_key = l_i != 0.0
    inv_l = tl.where(has_key, tl.math.div_rn(1.0, tl.where(has_key, l_i, 1.0)), 0.0)
    out = acc * inv_l[:, None]
    lse = tl.where(has_key, (m_i + tl.math.log2(tl.where(has_key, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    o_ptrs = q_rows[:, None] * D + offs_d[None, :]
    omask = rmask[:, None] & dmask[None, :]
    tl.store(OUT + o_ptrs, out.to(OUT.dtype.element_ty), mask=omask)
    if WRITE_OUT32:
        tl.store(OUT32 + o_ptrs, out, mask=omask)
    tl.store(LSE + q_rows, lse, mask=rmask)


@triton.jit
def _vsa_topk_kernel(
    SCORES, IDX, NUM,
    KVb, K,
    BLOCK_KV: tl.constexpr,
    TAKE_ALL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_KV)
    valid = cols < KVb
    if TAKE_ALL:  # k == KVb: every block, in order
        tl.store(IDX + row * K + cols, cols, mask=valid)
    else:
        x = tl.load(SCORES + row * KVb + cols, mask=valid, other=0.0)
        # Order-preserving int32 key: non-negative floats keep their bits, negative ones flip
        # their magnitude bits; -0.0 -> the key of +0.0 (they tie); NaN -> the largest key.
        # Integer tests on the bits only (a float compare could flush denormals to zero).
        bits = x.to(tl.int32, bitcast=True)
        mag = bits & 0x7FFFFFFF
        key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
        key = tl.where(mag == 0, 0, key)
        key = tl.where(mag > 0x7F800000, 0x7FFFFFFF, key)
        # Largest T with count(key >= T) >= K: the K-th largest key (binary search, 2^32 range).
        lo = tl.full([], -2147483648, tl.int64)
        hi = tl.full([], 2147483647, tl.int64)
        for _ in range(32):
            mid = (lo + hi + 1) >> 1
            cnt = tl.sum((valid & (key >= mid.to(tl.int32))).to(tl.int32), axis=0)
            ok = cnt >= K
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        t = lo.to(tl.int32)
        above = valid & (key > t)
        tie = valid & (key == t)
        need = K - tl.sum(above.to(tl.int32), axis=0)  # >= 1 ties to take, lowest index first
        tie_rank = tl.cumsum(tie.to(tl.int32), axis=0)
        sel = above | (tie & (tie_rank <= need))
        slot = tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.store(IDX + row * K + slot, cols, mask=sel)
    tl.store(NUM + row, K)


def coarse_tiles(head_dim: int):
    """(BLOCK_Q, BLOCK_KV, BLOCK_D, num_warps) of the coarse-attention backward (the forward has
    :func:`coarse_fwd_tiles`).

    Not tuned on a GPU yet. 16-row q tiles: at Wan-1.3B 480p (624 blocks, H=12) that is 468
    programs for 132 SMs; the kv chunk is 32 blocks (16 for head_dim 256: register budget)."""
    block_d = pow2_lanes(head_dim, 16)
    if block_d <= 128:
        return 16, 32, block_d, 4
    return 16, 16, block_d, 4


def coarse_fwd_tiles(head_dim: int):
    """(BLOCK_Q, BLOCK_KV, BLOCK_D, num_warps) of the coarse-attention forward. Measured on the H200
    (B=1, H=12, Qb=KVb=624, D=128; diag of 2026-12-01): 32 x 32, 4 warps: 78 us with tf32x3
    (16 x 32: 114 us; 32 x 64, 8 warps: 99 us; 64 x 64 does not fit in shared memory) and 305 us
    with ieee (16 x 32: 560 us). head_dim 256 keeps the smaller tiles (register budget)."""
    block_d = pow2_lanes(head_dim, 16)
    if block_d <= 128:
        return 32, 32, block_d, 4
    return 16, 16, block_d, 4


def _topk_warps(block_kv: int) -> int:
    # at most 64 keys per lane: 1 warp up to 2048 lanes, 8 warps at 16384
    return max(1, min(8, block_kv // (32 * 64)))


def vsa_select_fwd(qc, kc, vc, kv_sizes, out, out32, lse, q2k_idx, q2k_num, scores, *, topk: int,
                   sm_scale: float, precision: str = "ieee") -> None:
    """Coarse attention + top-k into caller-allocated tensors.

    ``qc [B,H,Qb,D]``, ``kc``/``vc [B,H,KVb,D]``: fp32 contiguous. ``kv_sizes``: int32 ``[KVb]``.
    ``out``: ``[B,H,Qb,D]`` contiguous, any float dtype. ``out32``: fp32 like ``out``, or ``None``.
    ``lse``: fp32 ``[B,H,Qb]``. ``q2k_idx``: int32 ``[B,H,Qb,k]`` with ``k = min(topk, KVb)``;
    ``q2k_num``: int32 ``[B,H,Qb]``. ``scores``: fp32 ``[B,H,Qb,KVb]`` scratch, needed (and
    written) only when ``topk < KVb``, else may be ``None``. ``precision``: one of
    :data:`COARSE_PRECISIONS`.
    """
    assert precision in COARSE_PRECISIONS, f"precision {precision!r}"
    B, H, Qb, D = qc.shape
    KVb = kc.shape[2]
    k_eff = min(int(topk), KVb)
    assert k_eff >= 1 and KVb <= MAX_KV_BLOCKS, f"topk {topk} / KVb {KVb} out of range"
    for name, x, shape in (("qc", qc, (B, H, Qb, D)), ("kc", kc, (B, H, KVb, D)), ("vc", vc, (B, H, KVb, D))):
        assert dtype_name(x) == "float32" and x.is_contiguous() and tuple(x.shape) == shape, f"{name}"
    assert dtype_name(kv_sizes) == "int32" and kv_sizes.is_contiguous() and kv_sizes.numel() == KVb
    assert out.is_contiguous() and tuple(out.shape) == (B, H, Qb, D), "out"
    if out32 is not None:
        assert dtype_name(out32) == "float32" and out32.is_contiguous() and tuple(out32.shape) == (B, H, Qb, D)
    assert dtype_name(lse) == "float32" and lse.is_contiguous() and tuple(lse.shape) == (B, H, Qb), "lse"
    assert dtype_name(q2k_idx) == "int32" and q2k_idx.is_contiguous() and tuple(q2k_idx.shape) == (B, H, Qb, k_eff)
    assert dtype_name(q2k_num) == "int32" and q2k_num.is_contiguous() and tuple(q2k_num.shape) == (B, H, Qb)
    take_all = k_eff == KVb
    if not take_all:
        assert scores is not None and dtype_name(scores) == "float32" and scores.is_contiguous() \
            and tuple(scores.shape) == (B, H, Qb, KVb), "scores scratch"
    block_q, block_kv, block_d, warps = coarse_fwd_tiles(D)
    _vsa_coarse_fwd_kernel[(triton.cdiv(Qb, block_q), B * H)](
        qc, kc, vc, kv_sizes, out, out32 if out32 is not None else out, lse,
        scores if not take_all else lse,
        Qb, KVb, D,
        float(sm_scale),
        BLOCK_Q=block_q, BLOCK_KV=block_kv, BLOCK_D=block_d,
        WRITE_SCORES=not take_all, WRITE_OUT32=out32 is not None, PRECISION=precision,
        num_warps=warps,
    )
    _launch_topk(scores if not take_all else lse, q2k_idx, q2k_num, B * H * Qb, KVb, k_eff)


def _launch_topk(scores, q2k_idx, q2k_num, rows, KVb, k_eff) -> None:
    lanes = pow2_lanes(KVb, 16)
    _vsa_topk_kernel[(rows,)](
        scores, q2k_idx, q2k_num,
        KVb, k_eff,
        BLOCK_KV=lanes, TAKE_ALL=k_eff == KVb,
        num_warps=_topk_warps(lanes),
    )


def vsa_topk(scores, q2k_idx, q2k_num, *, topk: int) -> None:
    """The top-k kernel alone, on a given fp32 contiguous ``scores [..., R, C]``: ``q2k_idx
    [..., R, min(topk, C)]`` (ascending) and ``q2k_num [..., R]`` (int32, contiguous)."""
    C = scores.shape[-1]
    k_eff = min(int(topk), C)
    assert k_eff >= 1 and C <= MAX_KV_BLOCKS, f"topk {topk} / {C} columns out of range"
    assert dtype_name(scores) == "float32" and scores.is_contiguous(), "scores must be fp32 contiguous"
    lead = tuple(scores.shape[:-1])
    assert dtype_name(q2k_idx) == "int32" and q2k_idx.is_contiguous() and tuple(q2k_idx.shape) == lead + (k_eff,)
    assert dtype_name(q2k_num) == "int32" and q2k_num.is_contiguous() and tuple(q2k_num.shape) == lead
    rows = q2k_num.numel()
    if rows:
        _launch_topk(scores, q2k_idx, q2k_num, rows, C, k_eff)
