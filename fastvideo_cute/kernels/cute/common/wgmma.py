# SPDX-License-Identifier: Apache-2.0
"""wgmma helpers shared by the sm_90a kernels (the 64-token forward and backward)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import warpgroup

__all__ = ["wgmma_gemm"]


@cute.jit
def wgmma_gemm(tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
               zero_init: cutlass.Constexpr[bool], ksteps: cutlass.Constexpr = None):
    """``acc (+)= A B`` as one wgmma group over the k-blocks of the fragments (modes (MMA, M, K)),
    fenced, issued and committed; the caller waits (``warpgroup.wait_group``). ``zero_init``: the
    first k-block overwrites ``acc`` instead of accumulating. ``ksteps``: only the first ``ksteps``
    k-blocks (the caller knows the rest of A or B is zero); None: all."""
    warpgroup.fence()
    atom = cute.make_mma_atom(tiled_mma.op)
    atom.set(warpgroup.Field.ACCUMULATE, not zero_init)
    for k in cutlass.range_constexpr(cute.size(tCrA.shape[2]) if cutlass.const_expr(ksteps is None) else ksteps):
        cute.gemm(atom, acc, tCrA[None, None, k], tCrB[None, None, k], acc)
        atom.set(warpgroup.Field.ACCUMULATE, True)
    warpgroup.commit_group()
