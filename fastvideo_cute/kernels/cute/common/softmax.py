# SPDX-License-Identifier: Apache-2.0
"""The online softmax of our attention forwards, written once: key masking, the per-block update
of a row's running max and sum, and the final normalisation (with the natural-log LSE).

A row may be held by one thread (``block_sparse_fwd64_sm100``: a TMEM lane per thread) or spread
over a group of lanes (``block_sparse_fwd128_sm120``: an mma.sync accumulator row lives in 4
lanes, ``threads_in_group=4``; the caller reduces the sum over the group before
:func:`row_scale`).

Contract (per row, scores ``s`` of the valid keys of each selected block, in selection order):
``m = max s`` (NaN-ignoring), ``p = exp2((s - m) * scale_log2)``, ``l = sum p``, the output
``(sum p v) / l``, ``lse = (m * scale_log2 + log2 l) * ln 2`` (natural log of ``sum exp(s *
scale)``). ``l == 0`` (no valid key) gives out 0 and LSE ``-inf``; a NaN score makes ``l`` NaN,
so the row's output and LSE are NaN (``l == 0`` is the test, never ``l > 0``). A row whose
scores are all ``-inf`` so far takes its exponents relative to 0, so no ``-inf - -inf`` NaN.
"""

from __future__ import annotations

import math

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, const_expr

LN2 = math.log(2.0)


@cute.jit
def mask_keys(rS: cute.Tensor, tScS: cute.Tensor, valid: Int32):
    """Scores of keys at or past ``valid`` -> -inf (a select: NaN/Inf scores there go too).
    ``tScS[i][1]`` is the key index (within the block) of ``rS[i]``."""
    for i in cutlass.range_constexpr(cute.size(rS)):
        if tScS[i][1] >= valid:
            rS[i] = -Float32.inf


@cute.jit
def mask_keys_mn(s_mn: cute.Tensor, c_mn: cute.Tensor, valid: Int32, cols: cutlass.Constexpr = None):
    """:func:`mask_keys` on (rows, cols) views of the scores and their coordinates: one compare
    per column, one select per element (``c_mn[0, c][1]`` is column ``c``'s key index). ``cols``:
    only the first ``cols`` columns of the view (None: all)."""
    for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1]) if const_expr(cols is None) else cols):
        drop = c_mn[0, c][1] >= valid
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            s_mn[r, c] = -Float32.inf if drop else s_mn[r, c]


@cute.jit
def mask_keys_pieces_mn(s_mn: cute.Tensor, c_mn: cute.Tensor, piece_keys: cute.Tensor,
                        piece: cutlass.Constexpr = 16, cols: cutlass.Constexpr = None):
    """:func:`mask_keys_mn` for a tile made of ``piece``-key pieces of different blocks: key ``k``
    (``c_mn[0, c][1]``) is kept when ``k % piece < piece_keys[k // piece]`` (``piece_keys``: a
    register tensor of the pieces' valid-key counts, 0 for an unused piece). Per column: the
    piece's count picked by selects and one compare; per element one select."""
    n_pieces = cute.size(piece_keys)
    for c in cutlass.range_constexpr(cute.size(s_mn, mode=[1]) if const_expr(cols is None) else cols):
        key = c_mn[0, c][1]
        which = key // piece
        keys = piece_keys[0]
        for p in cutlass.range_constexpr(1, n_pieces):
            keys = piece_keys[p] if which == p else keys
        drop = key - which * piece >= keys
        for r in cutlass.range_constexpr(cute.size(s_mn, mode=[0])):
            s_mn[r, c] = -Float32.inf if drop else s_mn[r, c]


@cute.jit
def online_softmax_update(srow: cute.TensorSSA, row_max: Float32, row_sum: Float32, scale_log2: Float32,
                          threads_in_group: cutlass.Constexpr = 1, p_out=None):
    """One block of a row (this thread's part of it): returns ``(p, new_max, new_sum, alpha)``;
    the caller rescales its accumulator by ``alpha`` before adding ``p @ V``. With
    ``threads_in_group > 1`` the max is reduced over the group; ``new_sum`` stays this thread's
    partial sum. ``p_out`` (a register tensor of the row's shape, e.g. the scores' own) receives
    ``p`` as soon as it is computed (fwd128 keeps P where S was; the order is the register
    schedule its measured build was compiled with)."""
    cur_max = srow.reduce(cute.ReductionOp.MAX, row_max, 0)
    if const_expr(threads_in_group > 1):
        cur_max = cute.arch.warp_reduction_max(cur_max, threads_in_group=threads_in_group)
    safe_max = Float32(0.0) if cur_max == -Float32.inf else cur_max
    p = cute.math.exp2(srow * scale_log2 - safe_max * scale_log2, fastmath=True)
    if const_expr(p_out is not None):
        p_out.store(p)
    alpha = cute.math.exp2((row_max - safe_max) * scale_log2, fastmath=True)
    new_sum = row_sum * alpha + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    return p, cur_max, new_sum, alpha


@cute.jit
def row_scale(row_sum: Float32):
    """Returns ``(inv, empty)``: the output scale ``1 / l`` and whether the row had no valid key
    (``l == 0``; then its output is 0). A NaN sum (NaN query row) is kept: NaN out."""
    empty = row_sum == Float32(0.0)
    inv = Float32(1.0) / (Float32(1.0) if empty else row_sum)
    return inv, empty


@cute.jit
def finalize_row(row_max: Float32, row_sum: Float32, scale_log2: Float32):
    """Returns ``(inv, lse, empty)``: :func:`row_scale` and the natural-log LSE (-inf when empty)."""
    inv, empty = row_scale(row_sum)
    safe_max = Float32(0.0) if row_max == -Float32.inf else row_max
    lse = (safe_max * scale_log2 + cute.math.log2(row_sum, fastmath=False)) * Float32(LN2)
    if empty:
        lse = -Float32.inf
    return inv, lse, empty


@cute.jit
def merge_weights(lse: Float32, lse_prev: Float32):
    """Two normalised partial outputs of one row over disjoint key sets, with natural-log LSEs
    ``lse`` (this one) and ``lse_prev``: returns ``(a, a_prev, merged_lse)`` such that the row's
    output is ``a * out + a_prev * out_prev``. A side with no key (LSE -inf) gets weight 0; both
    empty: weights 0 and LSE -inf (the contract's empty row); a NaN LSE on either side makes every
    result NaN."""
    nan = (lse != lse) | (lse_prev != lse_prev)
    m = lse if lse > lse_prev else lse_prev
    both_empty = m == -Float32.inf
    safe_m = Float32(0.0) if both_empty else m
    w = cute.math.exp2((lse - safe_m) * Float32(1.0 / LN2), fastmath=True)
    w_prev = cute.math.exp2((lse_prev - safe_m) * Float32(1.0 / LN2), fastmath=True)
    total = w + w_prev
    inv = Float32(1.0) / (Float32(1.0) if both_empty else total)
    merged = safe_m + cute.math.log2(Float32(1.0) if both_empty else total, fastmath=False) * Float32(LN2)
    a = w * inv
    a_prev = w_prev * inv
    if both_empty:
        merged = -Float32.inf
    if nan:
        a = Float32.nan
        a_prev = Float32.nan
        merged = Float32.nan
    return a, a_prev, merged


def tree_reduce(vals, op):
    """Trace-time pairwise reduction of a Python list of scalars: depth log2(n), not an n-long
    dependent chain (max is order-free; a sum in this order is deterministic)."""
    if len(vals) == 1:
        return vals[0]
    half = len(vals) // 2
    return op(tree_reduce(vals[:half], op), tree_reduce(vals[half:], op))


# |max * scale_log2| from which P = exp2(fma(s, c, -fl(max * c))) centres the row first: below it
# the rounding of fl(max * c) moves P by less than 2^-24 * 2^8 * ln 2 ~ 1e-5 relative.
FFMA_CENTRE_ABOVE = 256.0


@cute.jit
def _move_row(local: Float32, row_max: cute.Tensor, alpha: cute.Tensor, r: cutlass.Constexpr, scale_log2: Float32,
              threads_in_group: cutlass.Constexpr, rescale_threshold: cutlass.Constexpr):
    """Row ``r``'s max from this lane's part ``local`` and its running (or reference) max, reduced
    over the row's lanes; with ``rescale_threshold`` the reference max is kept unless the row grew
    past it by more than the threshold (an all -inf row so far: -inf - -inf is NaN, the compare is
    false, m stays -inf). Writes ``alpha[r]`` (the output's ratio) and ``row_max[r]``; returns the
    max the exponents are taken relative to (0 for a row still at -inf)."""
    m = cute.arch.fmax(local, row_max[r])
    if const_expr(threads_in_group > 1):
        m = cute.arch.warp_reduction_max(m, threads_in_group=threads_in_group)
    if const_expr(rescale_threshold is not None):
        m = row_max[r] if (m - row_max[r]) * scale_log2 <= Float32(rescale_threshold) else m
    sm = Float32(0.0) if m == -Float32.inf else m
    alpha[r] = cute.math.exp2((row_max[r] - sm) * scale_log2, fastmath=True)
    row_max[r] = m
    return sm


@cute.jit
def online_softmax_rows(s_mn: cute.Tensor, row_max: cute.Tensor, row_sum: cute.Tensor, alpha: cute.Tensor,
                        scale_log2: Float32, threads_in_group: cutlass.Constexpr = 4,
                        rescale_threshold: cutlass.Constexpr = None, vote_kept: cutlass.Constexpr = False,
                        neg_scaled_state=None, cols: cutlass.Constexpr = None):
    """The online-softmax step of :func:`online_softmax_update` for every row of a score
    fragment viewed as (rows, cols) (``s_mn``, overwritten with P), with tree reductions and one
    FFMA per exponent. ``row_max`` / ``row_sum`` (this thread's partial sum) / ``alpha`` (the ratio
    to rescale the output by) are per-row register tensors. The same contract (module docstring):
    a row whose scores are all -inf so far takes exponents relative to 0; NaN propagates.

    ``rescale_threshold`` (log2 units, e.g. 8.0): ``row_max`` is then the row's *reference* max,
    moved only when the block's max exceeds it by more than the threshold (``alpha`` is exactly 1
    otherwise, so the caller can skip its rescale). The exponents are then bounded by
    ``2^threshold`` instead of 1; out = (sum p v) / l and the LSE (``m * scale_log2 + log2 l``)
    are the same quantities for any reference max, so the contract holds unchanged.

    ``vote_kept`` (with ``rescale_threshold``): each lane first compares its own part of every row
    with the reference max, and only a warp in which some lane's part passed it by more than the
    threshold (or a row still at -inf) reduces the rows' maxima over their lanes and updates them;
    a warp where every lane keeps its reference maxima skips the shuffles and the ``alpha``
    exponents (``alpha`` is then exactly 1). The group's max passes the threshold only if one of its
    lanes' parts does, so the results are the same bits either way. ``neg_scaled_state`` (per row,
    0 before the first block) then carries ``-(max * scale_log2)`` from block to block, so a kept
    row does not recompute it. Returns whether the warp updated (warp-uniform; False means every
    ``alpha`` is 1).

    ``cols`` (None: all): only the view's first ``cols`` columns are the block's (the caller knows
    the rest hold only masked keys, and never reads their P). The max and the sum then skip terms
    that would have been -inf and 0, so the results are the same bits as over every column with
    the rest masked (``fmax(x, -inf) = x``, ``x + 0 = x``, and the trees split in halves)."""
    rows = cute.size(s_mn, mode=[0])
    cols = cute.size(s_mn, mode=[1]) if const_expr(cols is None) else cols
    safe = cute.make_rmem_tensor_like(row_max, Float32)
    neg_scaled = cute.make_rmem_tensor_like(row_max, Float32)
    centre = cutlass.Boolean(False)
    moved = cutlass.Boolean(True)
    local = [tree_reduce([s_mn[r, c] for c in range(cols)], cute.arch.fmax) for r in range(rows)]
    if const_expr(vote_kept):
        kept = cutlass.Boolean(True)
        for r in cutlass.range_constexpr(rows):
            # NaN (a row at -inf so far) compares false: not kept
            kept = kept & ((local[r] - row_max[r]) * scale_log2 <= Float32(rescale_threshold))
        moved = not cute.arch.vote_all_sync(kept)
        if moved:
            for r in cutlass.range_constexpr(rows):
                sm = _move_row(local[r], row_max, alpha, r, scale_log2, threads_in_group, rescale_threshold)
                neg_scaled_state[r] = -(sm * scale_log2)
        else:
            for r in cutlass.range_constexpr(rows):
                alpha[r] = Float32(1.0)
        for r in cutlass.range_constexpr(rows):
            safe[r] = Float32(0.0) if row_max[r] == -Float32.inf else row_max[r]
            neg_scaled[r] = neg_scaled_state[r]
            centre = centre | (cute.math.absf(neg_scaled[r]) >= Float32(FFMA_CENTRE_ABOVE))
    else:
        for r in cutlass.range_constexpr(rows):
            sm = _move_row(local[r], row_max, alpha, r, scale_log2, threads_in_group, rescale_threshold)
            safe[r] = sm
            neg_scaled[r] = -(sm * scale_log2)
            centre = centre | (cute.math.absf(neg_scaled[r]) >= Float32(FFMA_CENTRE_ABOVE))
    if cute.arch.vote_any_sync(centre):
        for r in cutlass.range_constexpr(rows):
            neg_scaled[r] = Float32(0.0)
            for c in cutlass.range_constexpr(cols):
                s_mn[r, c] = s_mn[r, c] - safe[r]
    for r in cutlass.range_constexpr(rows):
        for c in cutlass.range_constexpr(cols):
            s_mn[r, c] = cute.math.exp2(cute.math.fma(s_mn[r, c], scale_log2, neg_scaled[r]), fastmath=True)
        row_sum[r] = row_sum[r] * alpha[r] + tree_reduce([s_mn[r, c] for c in range(cols)], lambda a, b: a + b)
    return moved
