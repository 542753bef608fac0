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
