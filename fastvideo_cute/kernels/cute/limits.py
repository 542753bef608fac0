"""How a kernel declares its launch limits: plain Python (no CuTe DSL, no torch), so the
adapters' support predicates import the same values the kernel is written against.

Each op package declares its own in ``<op>/limits.py`` (``block_sparse_fwd128.limits.LIMITS``,
...); the predicates call :meth:`LaunchLimits.fits` before any launch.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["LaunchLimits", "INT32_MAX", "GRID_Y_MAX"]

INT32_MAX = 2**31 - 1
GRID_Y_MAX = 65535  # CUDA's limit on gridDim.y (and z)


class LaunchLimits(NamedTuple):
    """What one launch of a list-driven kernel covers: grid y (batch*heads), int32 row
    coordinates (batch*heads*seqlen) and int32 offsets into the index lists."""

    max_batch_heads: int
    max_rows: int
    max_index_elems: int

    def fits(self, batch: int, heads: int, seq: int, num_blocks: int, max_kv: int) -> bool:
        bh = batch * heads
        return bh <= self.max_batch_heads and bh * seq <= self.max_rows and \
            bh * num_blocks * max(max_kv, 1) <= self.max_index_elems

    def describe(self) -> str:
        return (f"exceeds the launch limits: batch*heads <= {self.max_batch_heads}, batch*heads*seqlen <= "
                f"{self.max_rows}, batch*heads*num_blocks*max_kv <= {self.max_index_elems}")
