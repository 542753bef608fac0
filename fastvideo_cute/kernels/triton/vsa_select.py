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

Tuning variants (keyword-only, default off; ``benchmarks/bench_glue.py`` sweeps them):
``topk_variant="rows{R}w{W}[x]"`` launches ``_vsa_topk_rows_kernel`` instead (R rows per program,
each row as two power-of-two chunks, optional early exit: the same lists) and
``"bisectw{W}"`` / ``"radixw{W}[x]"`` the kernels of ``vsa_topk_radix`` (one row per program: a
bisection from the row's min/max with value-space midpoints, or radix select in 4 histogram
passes; one running count for the slots; the same lists); ``tiles=`` /
``num_stages=`` re-tile the coarse kernel; ``kv_splits=S`` (with a caller's ``split_scratch``)
splits each row's kv walk over S programs that store partial (acc, max, sum) states, merged in
split order by ``_vsa_coarse_combine_kernel`` (one more launch; deterministic).

Memory: the scores scratch is the only ``[.., Qb, KVb]`` tensor (the caller frees it after the
call); nothing of that size is needed by the backward (``vsa_coarse_bwd.py`` recomputes P from
the LSE). Deterministic: every output element is written by one program, in a fixed order.

``coarse_variant="twophase"`` replaces launch 1 by ``vsa_coarse_fwd2.py``'s two launches (a
fully parallel scores + per-tile (max, sum) grid, then the combine and ``exp(s - m) @ vc`` from
the stored scores; needs the caller's ``scores`` even when ``topk >= KVb`` and a
``partial_scratch``); the same scores (one dot over D each), ``out_c``/LSE to fp32 rounding.

Inputs ``qc``, ``kc``, ``vc``: fp32 contiguous ``[B, H, n, D]``; any head_dim (masked lanes).
The launch helper writes into caller-allocated tensors and launches on the current CUDA device.
This module does not import torch.
"""

from __future__ import annotations

import re

import triton
import triton.language as tl

from .vsa_common import dtype_name, pow2_lanes
from .vsa_topk_radix import launch_topk_radix, parse_radix_variant

__all__ = ["vsa_select_fwd", "vsa_topk", "MAX_KV_BLOCKS", "COARSE_PRECISIONS", "coarse_tiles", "coarse_fwd_tiles",
           "TOPK_DEFAULT", "parse_topk_variant", "topk_chunks", "coarse_split_scratch_numel", "COARSE_VARIANTS"]

# Widest score row the top-k kernel keeps in one block (8 warps x 32 lanes x 64 keys).
MAX_KV_BLOCKS = 16384

# tl.dot input_precision of the coarse attention (fwd and bwd). "ieee" is plain fp32 (FMA, no
# tensor cores): the contract's fp32 scores. "tf32x3" (three TF32 MMAs, ~fp32 accuracy, tensor
# cores) is the candidate to measure if the coarse attention shows up in a profile.
COARSE_PRECISIONS = ("ieee", "tf32x3", "tf32")

# Coarse-forward implementations (vsa_select_fwd(coarse_variant=...)): "onepass" is
# _vsa_coarse_fwd_kernel (online softmax, one program per q tile walks every kv chunk);
# "twophase" is vsa_coarse_fwd2 (a fully parallel scores + partial (max, sum) launch, then one
# launch that combines the partials and sums exp(s - m) @ vc from the stored scores).
COARSE_VARIANTS = ("onepass", "twophase")

# Top-k kernel variants (every one gives the same index lists): "search32" is _vsa_topk_kernel
# (one row per program); "rows{R}w{W}[x]" is _vsa_topk_rows_kernel (R rows per program, W warps,
# "x": early exit); "bisectw{W}" / "radixw{W}[x]" are vsa_topk_radix's kernels (W warps, one row
# per program: bisection from the row's min/max with value-space midpoints / radix select in 4
# histogram passes). See parse_topk_variant.
TOPK_DEFAULT = "search32"
_TOPK_RE = re.compile(r"rows(\d+)w(\d+)(x?)")


@triton.jit
def _coarse_epilogue(acc, m_i, l_i, OUT, OUT32, LSE, q_rows, rmask, offs_d, dmask, D,
                     WRITE_OUT32: tl.constexpr):
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
def _vsa_coarse_fwd_kernel(
    QC, KC, VC, KV_SIZES, OUT, OUT32, LSE, SCORES, PART,
    Qb, KVb, D, R,
    sm_scale,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_SCORES: tl.constexpr,
    WRITE_OUT32: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLITS: tl.constexpr,
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
    if SPLITS == 1:
        c_lo = 0
        c_hi = KVb
    else:  # split s takes an equal share of the kv chunks
        per = tl.cdiv(tl.cdiv(KVb, BLOCK_KV), SPLITS) * BLOCK_KV
        c_lo = tl.program_id(2) * per
        c_hi = tl.minimum(c_lo + per, KVb)

    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    for c0 in range(c_lo, c_hi, BLOCK_KV):
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

    if SPLITS == 1:
        _coarse_epilogue(acc, m_i, l_i, OUT, OUT32, LSE, q_rows, rmask, offs_d, dmask, D, WRITE_OUT32)
    else:  # partial state of split s: PART[s, row] = (acc[0:D], m (log2 domain), l)
        prow = PART + (tl.program_id(2).to(tl.int64) * R + q_rows) * (D + 2)
        tl.store(prow[:, None] + offs_d[None, :], acc, mask=rmask[:, None] & dmask[None, :])
        tl.store(prow + D, m_i, mask=rmask)
        tl.store(prow + D + 1, l_i, mask=rmask)


@triton.jit
def _vsa_coarse_combine_kernel(
    PART, OUT, OUT32, LSE,
    Qb, D, R,
    BLOCK_Q: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_OUT32: tl.constexpr,
    SPLITS: tl.constexpr,
):
    """Merges the ``SPLITS`` partial softmax states of each row in split order (deterministic)."""
    pid_q = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rmask = rows < Qb
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q_rows = bh * Qb + rows.to(tl.int64)
    m_i = tl.full([BLOCK_Q], float("-inf"), dtype=tl.float32)
    for sp in tl.static_range(SPLITS):
        m_i = tl.maximum(m_i, tl.load(PART + (sp * R + q_rows) * (D + 2) + D, mask=rmask, other=float("-inf")))
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)
    l_i = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    for sp in tl.static_range(SPLITS):
        prow = PART + (sp * R + q_rows) * (D + 2)
        w = tl.math.exp2(tl.load(prow + D, mask=rmask, other=float("-inf")) - m_safe)
        l_i = l_i + tl.load(prow + D + 1, mask=rmask, other=0.0) * w
        part = tl.load(prow[:, None] + offs_d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
        acc = acc + part * w[:, None]
    _coarse_epilogue(acc, m_i, l_i, OUT, OUT32, LSE, q_rows, rmask, offs_d, dmask, D, WRITE_OUT32)


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


@triton.jit
def _order_keys(SCORES, rows64, rmask, cols, KVb):
    """Order-preserving int32 keys of ``SCORES[rows, cols]`` (as ``_vsa_topk_kernel``'s), and
    ``INT32_MIN`` for lanes past the row or rows past the end: no score has that key (it would be
    a NaN's bits, and NaN maps to the largest key), so a search threshold above it never counts them."""
    m = rmask[:, None] & (cols < KVb)[None, :]
    x = tl.load(SCORES + rows64[:, None] * KVb + cols[None, :], mask=m, other=0.0)
    bits = x.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = tl.where(mag == 0, 0, key)
    key = tl.where(mag > 0x7F800000, 0x7FFFFFFF, key)
    return tl.where(m, key, -2147483648)


@triton.jit
def _search_step(key_a, key_b, lo, hi, K, EARLY_EXIT: tl.constexpr):
    mid = (lo + hi + 1) >> 1
    m32 = mid.to(tl.int32)[:, None]
    cnt = tl.sum((key_a >= m32).to(tl.int32), axis=1) + tl.sum((key_b >= m32).to(tl.int32), axis=1)
    ok = cnt >= K
    new_lo = tl.where(ok, mid, lo)
    new_hi = tl.where(ok, hi, mid - 1)
    if EARLY_EXIT:  # exactly K keys >= mid: that set is the answer (see the kernel); stop this row
        new_hi = tl.where(cnt == K, mid, new_hi)
    return new_lo, new_hi


@triton.jit
def _vsa_topk_rows_kernel(
    SCORES, IDX, NUM,
    R, KVb, K,
    ROWS: tl.constexpr,
    MAIN: tl.constexpr,
    TAIL: tl.constexpr,
    EARLY_EXIT: tl.constexpr,
):
    """``ROWS`` rows per program, each row as two power-of-two chunks: columns ``[0, MAIN)`` and
    ``[MAIN, MAIN + TAIL)`` (624 columns: 512 + 128 lanes instead of 1024). The same keys, search
    and selection as ``_vsa_topk_kernel``, vectorised over rows, so the same index lists.

    ``EARLY_EXIT``: a row stops searching once some threshold ``m`` has exactly ``K`` keys ``>= m``
    (the loop runs while any row of the program is still open). That set is the same selection:
    the K-th largest key ``T`` is ``>= m``, so ``{key >= T}`` (at least K keys) is inside
    ``{key >= m}`` (exactly K), hence equal to it, and every tie at ``T`` is taken; with ``t = m``
    the selection code below takes exactly ``{key >= m}`` too."""
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    rows64 = rows.to(tl.int64)
    ca = tl.arange(0, MAIN)
    cb = MAIN + tl.arange(0, TAIL)
    key_a = _order_keys(SCORES, rows64, rmask, ca, KVb)
    key_b = _order_keys(SCORES, rows64, rmask, cb, KVb)
    # Rows past the end start closed (lo == hi): they never hold the early-exit loop open.
    lo = tl.where(rmask, -2147483648, 0).to(tl.int64)
    hi = tl.where(rmask, 2147483647, 0).to(tl.int64)
    if EARLY_EXIT:
        while tl.max(hi - lo, axis=0) > 0:
            lo, hi = _search_step(key_a, key_b, lo, hi, K, EARLY_EXIT)
    else:
        for _step in range(32):
            lo, hi = _search_step(key_a, key_b, lo, hi, K, EARLY_EXIT)
    t = lo.to(tl.int32)[:, None]  # > INT32_MIN for real rows: padding lanes are neither above nor tied
    above_a = key_a > t
    above_b = key_b > t
    tie_a = (key_a == t).to(tl.int32)
    tie_b = (key_b == t).to(tl.int32)
    need = K - tl.sum(above_a.to(tl.int32), axis=1) - tl.sum(above_b.to(tl.int32), axis=1)
    rank_a = tl.cumsum(tie_a, axis=1)
    rank_b = tl.cumsum(tie_b, axis=1) + tl.sum(tie_a, axis=1)[:, None]
    sel_a = above_a | ((tie_a != 0) & (rank_a <= need[:, None]))
    sel_b = above_b | ((tie_b != 0) & (rank_b <= need[:, None]))
    slot_a = tl.cumsum(sel_a.to(tl.int32), axis=1) - 1
    slot_b = tl.cumsum(sel_b.to(tl.int32), axis=1) - 1 + tl.sum(sel_a.to(tl.int32), axis=1)[:, None]
    base = IDX + rows64[:, None] * K
    tl.store(base + slot_a, ca[None, :] + tl.zeros([ROWS, MAIN], tl.int32), mask=sel_a & rmask[:, None])
    tl.store(base + slot_b, cb[None, :] + tl.zeros([ROWS, TAIL], tl.int32), mask=sel_b & rmask[:, None])
    tl.store(NUM + rows64, tl.zeros([ROWS], tl.int32) + K, mask=rmask)


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


def coarse_split_scratch_numel(B: int, H: int, Qb: int, D: int, kv_splits: int) -> int:
    """fp32 elements of the ``split_scratch`` that ``vsa_select_fwd(kv_splits > 1)`` needs:
    ``kv_splits * B*H*Qb * (D + 2)`` (each split's accumulator row, its max and its sum)."""
    return int(kv_splits) * B * H * Qb * (D + 2)


def _resolve_fwd_tiles(tiles, head_dim):
    block_q, block_kv, block_d, warps = coarse_fwd_tiles(head_dim)
    if tiles is None:
        return block_q, block_kv, block_d, warps
    if len(tiles) != 4:
        raise ValueError(f"tiles must be (BLOCK_Q, BLOCK_KV, BLOCK_D or None, num_warps), got {tiles!r}")
    bq, bkv, bd, w = tiles
    bd = block_d if bd is None else bd
    for name, x in (("BLOCK_Q", bq), ("BLOCK_KV", bkv), ("BLOCK_D", bd)):
        if int(x) < 16 or int(x) & (int(x) - 1):
            raise ValueError(f"tiles: {name}={x} must be a power of two >= 16 (tl.dot)")
    if bd < head_dim:
        raise ValueError(f"tiles: BLOCK_D={bd} < head_dim {head_dim}")
    if w not in (1, 2, 4, 8, 16):
        raise ValueError(f"tiles: num_warps={w} must be one of 1, 2, 4, 8, 16")
    return int(bq), int(bkv), int(bd), int(w)


def vsa_select_fwd(qc, kc, vc, kv_sizes, out, out32, lse, q2k_idx, q2k_num, scores, *, topk: int,
                   sm_scale: float, precision: str = "ieee", tiles=None, num_stages=None, kv_splits: int = 1,
                   split_scratch=None, topk_variant: str = TOPK_DEFAULT, coarse_variant: str = "onepass",
                   phase_tiles=None, partial_scratch=None, side=None) -> None:
    """Coarse attention + top-k into caller-allocated tensors.

    ``qc [B,H,Qb,D]``, ``kc``/``vc [B,H,KVb,D]``: fp32 contiguous. ``kv_sizes``: int32 ``[KVb]``.
    ``out``: ``[B,H,Qb,D]`` contiguous, any float dtype. ``out32``: fp32 like ``out``, or ``None``.
    ``lse``: fp32 ``[B,H,Qb]``. ``q2k_idx``: int32 ``[B,H,Qb,k]`` with ``k = min(topk, KVb)``;
    ``q2k_num``: int32 ``[B,H,Qb]``. ``scores``: fp32 ``[B,H,Qb,KVb]`` scratch, needed (and
    written) only when ``topk < KVb``, else may be ``None``. ``precision``: one of
    :data:`COARSE_PRECISIONS`.

    Overrides for tuning (the defaults are today's kernel): ``tiles=(BLOCK_Q, BLOCK_KV, BLOCK_D or
    None, num_warps)`` and ``num_stages`` of the coarse kernel; ``kv_splits > 1`` splits each row's
    kv walk over that many programs, merged by a second launch in split order (deterministic;
    needs ``split_scratch``, fp32 contiguous with :func:`coarse_split_scratch_numel` elements); a
    different tile or split changes the summation order, so ``out_c``/``lse`` agree with the
    default to fp32 rounding (scores: each is one dot over D, the same order in every tile on one
    GPU instruction kind); ``topk_variant``: :func:`parse_topk_variant` (the same lists always).

    ``coarse_variant``: one of :data:`COARSE_VARIANTS`. ``"twophase"`` runs
    ``vsa_coarse_fwd2.vsa_coarse_fwd2`` instead of the one-pass kernel (``tiles``, ``num_stages``,
    ``kv_splits`` must then be left at their defaults; ``phase_tiles``: its per-phase tiles, see
    ``vsa_coarse_fwd2.resolve_fwd2_tiles``). It needs ``scores`` always, also when ``topk >=
    KVb`` (phase 2 reads the scores back; the top-k then still takes every block in order), and
    ``partial_scratch``: fp32 contiguous with ``vsa_coarse_fwd2.coarse_fwd2_scratch_numel(B, H,
    Qb, KVb, D, phase_tiles)`` elements; ``ValueError`` when either is missing or too small. The
    same scores as the one-pass kernel up to the tile shape's summation order inside the dot
    (bitwise the same with equal tiles under the interpreter), ``out_c``/LSE to fp32 rounding.

    ``side`` (two-phase only): ``None``, or the caller's handle for a second stream, a context
    manager that launches what runs inside it there (after the launches before it) plus a
    ``join()`` that makes the launching stream wait for that work. Phase 2 (``out_c``, LSE) is
    launched inside ``side`` and the top-k (which reads only phase 1's scores) after it on the
    launching stream, then ``side.join()``: the two run at the same time, the same launches and
    bits as without ``side``. This module does not make streams (it does not import torch):
    ``vsa_ops._SideStream`` is the one the library passes.
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
    if coarse_variant not in COARSE_VARIANTS:
        raise ValueError(f"coarse_variant must be one of {COARSE_VARIANTS}, got {coarse_variant!r}")
    two_phase = coarse_variant == "twophase"
    if two_phase:
        if tiles is not None or num_stages is not None or int(kv_splits) != 1:
            raise ValueError("coarse_variant='twophase' takes phase_tiles=, not the one-pass kernel's "
                             "tiles= / num_stages= / kv_splits=")
        if scores is None or dtype_name(scores) != "float32" or not scores.is_contiguous() \
                or tuple(scores.shape) != (B, H, Qb, KVb):
            raise ValueError(f"coarse_variant='twophase' needs scores: fp32 contiguous {(B, H, Qb, KVb)}, "
                             "also when topk >= KVb")
    elif phase_tiles is not None or partial_scratch is not None or side is not None:
        raise ValueError("phase_tiles= / partial_scratch= / side= are for coarse_variant='twophase'")
    if not take_all:
        assert scores is not None and dtype_name(scores) == "float32" and scores.is_contiguous() \
            and tuple(scores.shape) == (B, H, Qb, KVb), "scores scratch"
    parse_topk_variant(topk_variant)  # raises on a bad name before any launch
    block_q, block_kv, block_d, warps = _resolve_fwd_tiles(tiles, D)
    splits = int(kv_splits)
    if splits < 1:
        raise ValueError(f"kv_splits must be >= 1, got {kv_splits}")
    R = B * H * Qb
    if splits > 1:
        need = coarse_split_scratch_numel(B, H, Qb, D, splits)
        if split_scratch is None or dtype_name(split_scratch) != "float32" or not split_scratch.is_contiguous() \
                or split_scratch.numel() < need:
            raise ValueError(f"kv_splits={splits} needs split_scratch: fp32 contiguous, >= {need} elements")
    extra = {} if num_stages is None else {"num_stages": int(num_stages)}
    out32_arg = out32 if out32 is not None else out
    if two_phase:
        from .vsa_coarse_fwd2 import vsa_coarse_fwd2  # lazily: the one-pass path never needs it

        vsa_coarse_fwd2(qc, kc, vc, kv_sizes, out, out32, lse, scores, partial_scratch, sm_scale=sm_scale,
                        precision=precision, tiles=phase_tiles, phase2_context=side)
    else:
        _vsa_coarse_fwd_kernel[(triton.cdiv(Qb, block_q), B * H, splits)](
            qc, kc, vc, kv_sizes, out, out32_arg, lse,
            scores if not take_all else lse, split_scratch if splits > 1 else lse,
            Qb, KVb, D, R,
            float(sm_scale),
            BLOCK_Q=block_q, BLOCK_KV=block_kv, BLOCK_D=block_d,
            WRITE_SCORES=not take_all, WRITE_OUT32=out32 is not None, PRECISION=precision, SPLITS=splits,
            num_warps=warps, **extra,
        )
    if splits > 1:
        _vsa_coarse_combine_kernel[(triton.cdiv(Qb, 32), B * H)](
            split_scratch, out, out32_arg, lse,
            Qb, D, R,
            BLOCK_Q=32, BLOCK_D=block_d, WRITE_OUT32=out32 is not None, SPLITS=splits,
            num_warps=4,
        )
    _launch_topk(scores if not take_all else lse, q2k_idx, q2k_num, R, KVb, k_eff, topk_variant)
    if side is not None:
        side.join()


def topk_chunks(kvb: int):
    """(MAIN, TAIL) lane counts of ``_vsa_topk_rows_kernel`` for a row of ``kvb`` scores: the
    power-of-two half of ``pow2(kvb)`` plus the power of two covering the rest (624: 512 + 128;
    1180: 1024 + 256; a power of two: two halves; both at least 16)."""
    main = max(16, pow2_lanes(kvb, 16) // 2)
    return main, pow2_lanes(max(int(kvb) - main, 1), 16)


def parse_topk_variant(variant: str):
    """``None`` for ``"search32"`` (``_vsa_topk_kernel``, one row per program), else
    ``(rows, num_warps, early_exit)`` of ``_vsa_topk_rows_kernel`` from ``"rows{R}w{W}"`` (32
    search steps) or ``"rows{R}w{W}x"`` (early exit); R and W powers of two, W <= 8; or
    ``("bisect" | "radix", num_warps, early_exit)`` of ``vsa_topk_radix`` from ``"bisectw{W}"`` /
    ``"radixw{W}[x]"``."""
    if variant == "search32":
        return None
    radix = parse_radix_variant(variant)  # vsa_topk_radix's kernels
    if radix is not None:
        return radix
    m = _TOPK_RE.fullmatch(str(variant))
    if m is None:
        raise ValueError(f"topk variant must be 'search32' or like 'rows4w4' / 'rows4w4x' / 'bisectw1' / "
                         f"'radixw4x', got {variant!r}")
    rows, warps = int(m.group(1)), int(m.group(2))
    if rows < 1 or rows & (rows - 1) or warps not in (1, 2, 4, 8):
        raise ValueError(f"topk variant {variant!r}: rows must be a power of two, warps one of 1, 2, 4, 8")
    return rows, warps, bool(m.group(3))


def _launch_topk(scores, q2k_idx, q2k_num, rows, KVb, k_eff, variant=TOPK_DEFAULT) -> None:
    cfg = parse_topk_variant(variant)
    if cfg is None or k_eff == KVb:  # k == KVb: the copy-out path of the one-row kernel
        lanes = pow2_lanes(KVb, 16)
        _vsa_topk_kernel[(rows,)](
            scores, q2k_idx, q2k_num,
            KVb, k_eff,
            BLOCK_KV=lanes, TAKE_ALL=k_eff == KVb,
            num_warps=_topk_warps(lanes),
        )
        return
    if cfg[0] in ("bisect", "radix"):
        launch_topk_radix(scores, q2k_idx, q2k_num, rows, KVb, k_eff, cfg)
        return
    per_row, warps, early = cfg
    main, tail = topk_chunks(KVb)
    # at most 64 keys per lane (register budget): fewer rows per program for wide rows
    per_row = max(1, min(per_row, (64 * 32 * warps) // (main + tail)))
    per_row = 1 << (per_row.bit_length() - 1)
    _vsa_topk_rows_kernel[(triton.cdiv(rows, per_row),)](
        scores, q2k_idx, q2k_num,
        rows, KVb, k_eff,
        ROWS=per_row, MAIN=main, TAIL=tail, EARLY_EXIT=early,
        num_warps=warps,
    )


def vsa_topk(scores, q2k_idx, q2k_num, *, topk: int, variant: str = TOPK_DEFAULT) -> None:
    """The top-k kernel alone, on a given fp32 contiguous ``scores [..., R, C]``: ``q2k_idx
    [..., R, min(topk, C)]`` (ascending) and ``q2k_num [..., R]`` (int32, contiguous).
    ``variant``: see :func:`parse_topk_variant` (every variant gives the same lists)."""
    C = scores.shape[-1]
    k_eff = min(int(topk), C)
    assert k_eff >= 1 and C <= MAX_KV_BLOCKS, f"topk {topk} / {C} columns out of range"
    assert dtype_name(scores) == "float32" and scores.is_contiguous(), "scores must be fp32 contiguous"
    lead = tuple(scores.shape[:-1])
    assert dtype_name(q2k_idx) == "int32" and q2k_idx.is_contiguous() and tuple(q2k_idx.shape) == lead + (k_eff,)
    assert dtype_name(q2k_num) == "int32" and q2k_num.is_contiguous() and tuple(q2k_num.shape) == lead
    rows = q2k_num.numel()
    if rows:
        _launch_topk(scores, q2k_idx, q2k_num, rows, C, k_eff, variant)
