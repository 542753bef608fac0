# SPDX-License-Identifier: Apache-2.0
"""The backward's two per-element steps on a kv-major (S^T / dP^T) accumulator tile, written once for
the sm_90a main kernels (``block_sparse_bwd64_sm90``, ``block_sparse_bwd64_sm90_ws``): rows are keys,
columns queries; keys at or past the kv block's ``size`` are set to exactly 0 by selection (never by
multiplication, so NaN/Inf read from padding cannot leak)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, const_expr

__all__ = ["probs_t", "dscores_t"]


@cute.jit
def probs_t(acc_mn: cute.Tensor, coords_mn: cute.Tensor, lse2: cute.Tensor, scale_log2: Float32, size):
    """In place: ``P^T[r, c] = exp2(S^T[r, c] * scale_log2 - lse2[c])``, 0 for padded keys."""
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        valid = coords_mn[r, 0][0] < size
        for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
            p = cute.math.exp2(acc_mn[r, c] * scale_log2 - lse2[c], fastmath=True)
            acc_mn[r, c] = p if valid else Float32(0.0)


@cute.jit
def dscores_t(p_mn: cute.Tensor, acc_mn: cute.Tensor, coords_mn: cute.Tensor, delta: cute.Tensor, size,
              select: cutlass.Constexpr = True):
    """In place on the dP^T tile ``acc_mn``: ``dS^T[r, c] = P^T[r, c] * (dP^T[r, c] - delta[c])``, 0 for
    padded keys. ``select=False`` leaves out the padded-key select: only for a caller whose dP^T rows
    of padded keys are exactly 0 (V's padded rows zeroed before ``dP^T = V dO^T``) and whose P^T rows
    of padded keys are 0 by :func:`probs_t`'s select, so that the product is an exact 0 by itself."""
    for r in cutlass.range_constexpr(cute.size(acc_mn, mode=[0])):
        valid = coords_mn[r, 0][0] < size
        for c in cutlass.range_constexpr(cute.size(acc_mn, mode=[1])):
            ds = p_mn[r, c] * (acc_mn[r, c] - delta[c])
            if const_expr(select):
                ds = ds if valid else Float32(0.0)
            acc_mn[r, c] = ds
