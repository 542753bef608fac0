"""FA4 block-sparse lists from a logical VSA block map in one Triton launch.

FA4's block sparsity wants, per *physical* tile row, two index lists: the FULL kv tiles (no
masking) and the PARTIAL ones (its ``mask_mod`` decides per element). The torch path in
``fastvideo_cute/adapters/fa4_metadata.py`` builds them with about a dozen launches (expand the
map to physical tiles, compare the tile sizes, two ``map_to_index`` passes); this kernel writes the
same four tensors, bit for bit, in one.

Inputs: the logical map ``[B, H, Qb, KVb]`` through its strides (non-zero = selected; a batch
stride of 0, an expanded map, is fine), the logical kv block sizes ``[KVb]`` (int32), the factors
``QF`` (physical q rows per logical q block) and ``KVF`` (physical kv tiles per logical kv block)
and the kv tile ``KVT``. The physical tile sizes are ``ts[c] = clamp(size[c // KVF] - (c % KVF) *
KVT, 0, KVT)`` (``metadata.split_block_sizes``); the kernel also writes them out (``TS_OUT``, the
mask_mod's aux tensor), from the programs of the first (b, h) only.

- forward (``TRANSPOSE=False``): rows are physical q blocks ``r`` (``R = Qb * QF``), columns
  physical kv tiles ``c`` (``C = KVb * KVF``); ``sel = map[b, h, r // QF, c // KVF]``; FULL where
  ``ts[c] == KVT``, PARTIAL where ``0 < ts[c] < KVT`` (size-0 tiles in neither);
- backward (``TRANSPOSE=True``): rows are physical kv tiles, columns physical q blocks; the row's
  tile size decides FULL / PARTIAL for the whole row.

``ALL_FULL`` (the caller knows every tile is full): FULL is the selection itself and the PARTIAL
lists are zeros (count 0), as the torch path returns them.

Each row's list holds the selected columns ascending, then the unselected ones ascending (what
``map_to_index`` gives; entries past the count are filler FA4 never reads). One program per row,
the whole row in one block of ``BLOCK_C`` lanes; every output element written by one program, no
atomics, no host sync. This module does not import torch.
"""

from __future__ import annotations

from typing import Optional

import triton
import triton.language as tl

__all__ = ["fa4_lists_launch", "MAX_COLS"]

MAX_COLS = 1 << 15


@triton.jit
def _store_list(sel, cols, valid, Idx, Cnt, row, C):
    s = sel.to(tl.int32)
    csum = tl.cumsum(s, axis=0)
    num = tl.sum(s, axis=0)
    slot = tl.where(s != 0, csum - 1, num + cols - csum)
    tl.store(Idx + row * C + slot, cols, mask=valid)
    tl.store(Cnt + row, num)


@triton.jit
def _fa4_lists_kernel(
    Map, SIZES, TS_OUT, FIdx, FCnt, MIdx, MCnt,
    s_b, s_h, s_q, s_k,
    H, R, C, KVT, QF, KVF,
    BLOCK_C: tl.constexpr,
    TRANSPOSE: tl.constexpr,
    ALL_FULL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # flattened (b, h, r); outputs are contiguous
    n = row // R
    r = row % R
    base = Map + (n // H) * s_b + (n % H) * s_h
    cols = tl.arange(0, BLOCK_C)
    valid = cols < C
    if TRANSPOSE:  # row r: kv tile; column c: q block
        ptrs = base + (cols // QF).to(tl.int64) * s_q + (r // KVF) * s_k
        sel = (tl.load(ptrs, mask=valid, other=0) != 0) & valid
        ts = tl.minimum(tl.maximum(tl.load(SIZES + r // KVF) - (r % KVF) * KVT, 0), KVT)
        if n == 0:
            tl.store(TS_OUT + r, ts)
    else:  # row r: q block; column c: kv tile
        ptrs = base + (r // QF) * s_q + (cols // KVF).to(tl.int64) * s_k
        sel = (tl.load(ptrs, mask=valid, other=0) != 0) & valid
        size = tl.load(SIZES + cols // KVF, mask=valid, other=0)
        ts = tl.minimum(tl.maximum(size - (cols % KVF) * KVT, 0), KVT)
        if row == 0:
            tl.store(TS_OUT + cols, ts, mask=valid)
    full = sel & (ts == KVT)
    part = sel & (ts > 0) & (ts < KVT)
    if ALL_FULL:
        _store_list(sel, cols, valid, FIdx, FCnt, row, C)
        tl.store(MIdx + row * C + cols, tl.zeros([BLOCK_C], tl.int32), mask=valid)
        tl.store(MCnt + row, 0)
    else:
        _store_list(full, cols, valid, FIdx, FCnt, row, C)
        _store_list(part, cols, valid, MIdx, MCnt, row, C)


def fa4_lists_launch(block_map, sizes, tile_sizes, full_idx, full_cnt, mask_idx, mask_cnt, *, q_factor: int,
                     kv_factor: int, kv_tile: int, transpose: bool, all_full: bool,
                     num_warps: Optional[int] = None) -> None:
    """One launch into caller-allocated int32 contiguous outputs: ``*_idx [B, H, R, C]`` and
    ``*_cnt [B, H, R]`` (``R``, ``C``: physical rows and columns as the module docstring says)
    and ``tile_sizes [KVb * kv_factor]``. ``block_map``: ``[B, H, Qb, KVb]`` uint8 (a bool map's
    ``view(torch.uint8)``) or any integer dtype, any strides; ``sizes``: int32 contiguous
    ``[KVb]``. Launches on the current device (the caller sets it). ``num_warps``: instead of
    the default (the benchmark's sweep, ``benchmarks/sweep_map_to_index.py``)."""
    B, H, Qb, KVb = (int(x) for x in block_map.shape)
    R, C = (KVb * kv_factor, Qb * q_factor) if transpose else (Qb * q_factor, KVb * kv_factor)
    assert 0 < C <= MAX_COLS, f"{C} columns: 1 to {MAX_COLS}"
    assert int(sizes.numel()) == KVb and sizes.is_contiguous(), "sizes"
    assert int(tile_sizes.numel()) == KVb * kv_factor and tile_sizes.is_contiguous(), "tile_sizes"
    for name, t, shape in (("full_idx", full_idx, (B, H, R, C)), ("mask_idx", mask_idx, (B, H, R, C)),
                           ("full_cnt", full_cnt, (B, H, R)), ("mask_cnt", mask_cnt, (B, H, R))):
        assert tuple(t.shape) == shape and t.is_contiguous(), f"{name}: {tuple(t.shape)} vs {shape}"
    rows = B * H * R
    if rows == 0:
        return
    block_c = max(triton.next_power_of_2(C), 16)
    if num_warps is None:  # one warp up to 1024 lanes, as map_to_index measured (its launch_config)
        num_warps = 1 if block_c <= 1024 else (4 if block_c <= 4096 else 8)
    _fa4_lists_kernel[(rows,)](
        block_map, sizes, tile_sizes, full_idx, full_cnt, mask_idx, mask_cnt,
        block_map.stride(0), block_map.stride(1), block_map.stride(2), block_map.stride(3),
        H, R, C, int(kv_tile), int(q_factor), int(kv_factor),
        BLOCK_C=block_c, TRANSPOSE=bool(transpose), ALL_FULL=bool(all_full),
        num_warps=num_warps,
    )
