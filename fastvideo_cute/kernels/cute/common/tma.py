# SPDX-License-Identifier: Apache-2.0
"""TMA partitions shared by the kernels that address tensors as 2-D row views (the 64-token
backward's main kernels, sm_90a)."""

from __future__ import annotations

import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync

__all__ = ["tma_row_tiles"]


@cute.jit
def tma_row_tiles(tma_atom: cute.CopyAtom, mX: cute.Tensor, sX: cute.Tensor, tile):
    """``(tXsX, tXgX)``: the TMA partitions of a copy between ``tile = (rows, cols)`` tiles of the
    row-major ``[R, cols]`` tensor ``mX`` (``tXgX[None, rb]``: row block ``rb``) and the shared-memory
    tile ``sX`` (its modes past the first two, if any, are ring stages: ``tXsX[None, s]``)."""
    gX = cute.local_tile(mX, tile, (None, 0))
    return cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(sX, 0, 2),
                                 cute.group_modes(gX, 0, 2))
