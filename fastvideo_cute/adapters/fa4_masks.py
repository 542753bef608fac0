"""CuTe-DSL mask_mods for the FA4 block-sparse route.

Importing this module imports the CuTe DSL and FlashAttention-4, so only
:mod:`fastvideo_cute.adapters.fa4` imports it, lazily, after the version check.

Why a cached factory: FA4 keys its compile cache on ``utils.hash_callable(mask_mod)``, a
sha256 of the function's source text plus ``repr`` of every closure cell (and of
``__defaults__``), memoised on the function object as ``__cute_hash__``. Two mask_mods built by
this factory for the same tile size therefore hash the same, and ``lru_cache`` hands back the
very same object anyway, so each tile size compiles once per (dtype, head_dim, arch), not once
per call. The closure holds nothing but the tile size (an ``int``), so the hash is stable
across processes too (it is what FA4's on-disk kernel cache is keyed on).
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from flash_attn.cute import utils as fa_utils

__all__ = ["kv_valid_len_mask"]


@functools.lru_cache(maxsize=None)
def kv_valid_len_mask(kv_tile: int):
    """mask_mod keeping key ``j`` iff ``j % kv_tile < aux_tensors[0][j // kv_tile]``.

    ``aux_tensors[0]`` is the int32 ``[num_physical_kv_tiles]`` vector of valid leading tokens
    per physical kv tile. FA4 evaluates a mask_mod only on the tiles listed as *partial*
    (``mask_block_idx``); tiles listed as *full* skip it.
    """
    tile = int(kv_tile)
    if tile <= 0:
        raise ValueError(f"kv_tile must be positive, got {kv_tile}")

    @cute.jit
    def vsa_kv_valid_len_mask(batch, head, q_idx, kv_idx, seqlen_info, aux_tensors):
        valid_len = aux_tensors[0]
        blk = kv_idx[0] // tile
        limit = fa_utils.scalar_to_ssa(valid_len[blk], cutlass.Int32)
        start = fa_utils.scalar_to_ssa(blk * tile, cutlass.Int32)
        return (kv_idx - start) < limit

    return vsa_kv_valid_len_mask
