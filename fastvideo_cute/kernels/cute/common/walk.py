# SPDX-License-Identifier: Apache-2.0
"""The list walk: a query block's kv list in ``map_to_index`` layout (``mIdx[query, 0:count)``,
entries past the count never read) and the valid keys of each listed kv block
(``mVbs[kv]`` clamped to ``[0, block]``; an index outside ``[0, tiles)`` is a block of 0 keys).

``walk_*`` read the list rotated by ``start`` (the fwd128 phased walk starts part-way through and
wraps); ``list_entry`` / ``next_valid`` read it in order (fwd64). Used by
``block_sparse_fwd128_sm120`` and ``block_sparse_fwd64_sm100``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Int32


@cute.jit
def tile_keys(mVbs: cute.Tensor, kv_tile: Int32, tiles: Int32, block: cutlass.Constexpr):
    """The valid keys of a listed kv block, 0..block (0 for an index outside [0, tiles))."""
    valid = Int32(0)
    if kv_tile >= 0 and kv_tile < tiles:
        valid = cutlass.min(cutlass.max(mVbs[kv_tile], Int32(0)), Int32(block))
    return valid


@cute.jit
def walk_tile(mIdx: cute.Tensor, query: Int32, e: Int32, start: Int32, count: Int32):
    """The kv block of entry ``e`` of a query block's walk (its list rotated by ``start``), as
    listed (unchecked)."""
    at = e + start
    if at >= count:
        at = at - count
    return mIdx[query, at]


@cute.jit
def walk_entry(mIdx: cute.Tensor, mVbs: cute.Tensor, query: Int32, e: Int32, start: Int32, count: Int32,
               tiles: Int32, block: cutlass.Constexpr):
    """Entry ``e`` of the rotated walk: (kv block, its valid keys); invalid blocks have 0 keys."""
    kv_tile = walk_tile(mIdx, query, e, start, count)
    return kv_tile, tile_keys(mVbs, kv_tile, tiles, block)


@cute.jit
def list_entry(mIdx: cute.Tensor, mVbs: cute.Tensor, query: Int32, e: Int32, tiles: Int32,
               block: cutlass.Constexpr):
    """Entry ``e`` of the list, in order: (kv block, its valid keys); invalid blocks have 0 keys."""
    kv_tile = mIdx[query, e]
    return kv_tile, tile_keys(mVbs, kv_tile, tiles, block)


@cute.jit
def next_valid(mIdx: cute.Tensor, mVbs: cute.Tensor, query: Int32, e: Int32, count: Int32, tiles: Int32,
               block: cutlass.Constexpr):
    """The first entry at or after ``e`` with valid keys, ``count`` if none."""
    j = e
    searching = j < count
    while searching:
        _, valid = list_entry(mIdx, mVbs, query, j, tiles, block)
        if valid > 0:
            searching = False
        else:
            j = j + 1
            searching = j < count
    return j
