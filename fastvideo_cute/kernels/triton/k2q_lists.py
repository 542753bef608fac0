"""Fused k2q lists: block map ``[..., R, C]`` -> the lists of its *columns* in one Triton launch.

What ``map_to_index(map.transpose(-2, -1))`` gives (``fastvideo_cute/metadata.py``; the torch
path stays the reference and the CPU path), cut to what the backward kernels read: for each
column ``c`` of a map ``[..., R, C]`` (``R`` q blocks, ``C`` kv blocks) the rows ``r`` with
``map[..., r, c] != 0`` in ascending order in the first ``num[..., c]`` slots of
``idx[..., c, :]``; ``num`` is their count. Slots past ``num`` are NOT written: they keep
whatever the output held (uninitialised memory from :func:`k2q_lists_fused`), where
``map_to_index`` puts the unselected rows. Every consumer of k2q lists (the Hopper / Blackwell
64-token backward: ``adapters/cute_sm90_bwd64*.py``, ``cute_sm100_bwd.py`` and their kernels)
reads only the first ``num`` entries of a row.

Dataflow: one program per (leading index ``n``, block of ``BLOCK_C`` columns), grid
``(N * cdiv(C, BLOCK_C),)`` with ``N`` the product of the leading dims. The program walks the
rows in chunks of ``BLOCK_R``: it loads the ``[BLOCK_R, BLOCK_C]`` tile through the map's strides
(for a contiguous map a row of the tile is ``BLOCK_C`` consecutive elements: coalesced, where
``map_to_index`` of the transposed view reads down a column), takes each column's running count
within the chunk (``tl.cumsum`` down the rows), and stores row ``r`` to
``idx[n, c, count + cumsum - 1]`` where selected (the stores of one column are consecutive
slots); ``count`` (the column's selected rows in the chunks before) then grows by the chunk's
column sums and is stored as ``num[n, c]`` after the last chunk. No atomics, no host sync; only
the selected entries are written (``num`` int32 values, against the whole ``R``-wide permutation).

Constraints: any map strides (the leading dims are flattened by ``reshape``: a view where they
allow it, else a copy); bool, or any int/float dtype read as ``!= 0`` (dtype handling and output
checks shared with ``map_to_index.py``); outputs int32 and contiguous, ``idx [..., C, R]``,
``num [..., C]``. ``BLOCK_C`` and ``BLOCK_R`` are powers of two (``tl.arange``); every choice writes
the same lists. Under ``TRITON_INTERPRET=1`` the kernel runs on CPU tensors (the tests).
"""

from __future__ import annotations

from typing import Tuple

import torch
import triton
import triton.language as tl

from .map_to_index import _check_map_dims, _check_output, _flatten_leading, _loadable

__all__ = ["k2q_lists_triton", "k2q_lists_fused", "BLOCK_C", "BLOCK_R", "NUM_WARPS"]

#: columns (kv blocks) per program: 32 bytes of a bool map's row (one sector) per tile row, and
#: twice the programs of 64 (12 heads x 512 kv blocks: 192 programs; at 64 columns, 96, under one
#: per SM of an H100 / H200). Not yet measured on a GPU: the launch helper takes it as a parameter.
BLOCK_C = 32
#: rows (q blocks) per chunk of the walk: a 64 x 32 tile, 16 elements a thread with four warps
BLOCK_R = 64
#: warps per program
NUM_WARPS = 4


@triton.jit
def _k2q_lists_kernel(
    Map, Idx, Num,
    stride_mn, stride_mr, stride_mc,
    R, C, CBLOCKS,
    BLOCK_C: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    n = (pid // CBLOCKS).to(tl.int64)
    cols = (pid % CBLOCKS) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    cols64 = cols.to(tl.int64)
    m_cols = Map + n * stride_mn + cols64 * stride_mc  # [BLOCK_C]: row 0 of each column
    out_rows = Idx + (n * C + cols64) * R  # [BLOCK_C]: each column's list (idx is contiguous)
    count = tl.zeros((BLOCK_C,), dtype=tl.int32)  # selected rows before the chunk, per column
    lanes = tl.arange(0, BLOCK_R)
    for r0 in range(0, R, BLOCK_R):
        rows = r0 + lanes
        valid = (rows < R)[:, None] & cmask[None, :]
        tile = tl.load(m_cols[None, :] + rows.to(tl.int64)[:, None] * stride_mr, mask=valid, other=0)
        sel = (tile != 0).to(tl.int32)  # masked lanes: not selected
        rank = tl.cumsum(sel, axis=0)  # the column's selected rows in the chunk at or before r
        slot = count[None, :] + rank - 1
        values = tl.broadcast_to(rows[:, None], (BLOCK_R, BLOCK_C))
        tl.store(out_rows[None, :] + slot, values, mask=sel != 0)
        count += tl.sum(sel, axis=0)
    tl.store(Num + n * C + cols64, count, mask=cmask)


def k2q_lists_triton(block_map: torch.Tensor, idx_out: torch.Tensor, num_out: torch.Tensor, *,
                     block_c: int = BLOCK_C, block_r: int = BLOCK_R, num_warps: int = NUM_WARPS) -> None:
    """Block map ``[..., R, C]`` (bool, or any int/float dtype read as ``!= 0``; any strides) ->
    k2q lists written into caller-allocated ``idx_out`` (int32 ``[..., C, R]``, contiguous: row
    ``c``'s first ``num_out[..., c]`` slots get the rows selected in column ``c``, ascending; the
    slots past that are left as they were) and ``num_out`` (int32 ``[..., C]``, contiguous), on
    the map's device.

    ``block_c`` / ``block_r`` (powers of two) and ``num_warps``: the tile and warps of each
    program (for a GPU sweep; every choice writes the same lists). Raises ``ValueError`` naming
    the argument for a map of fewer than two dims, an output of the wrong shape, dtype, device or
    layout, or a tile size that is not a power of two.
    """
    _check_map_dims(block_map)
    shape = tuple(block_map.shape)
    R, C = shape[-2:]
    _check_output("idx_out", idx_out, (*shape[:-2], C, R), block_map.device)
    _check_output("num_out", num_out, (*shape[:-2], C), block_map.device)
    for name, value in (("block_c", block_c), ("block_r", block_r)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
            raise ValueError(f"{name} must be a power of two, got {value!r}")
    if isinstance(num_warps, bool) or not isinstance(num_warps, int) or num_warps < 1:
        raise ValueError(f"num_warps must be a positive int, got {num_warps!r}")
    if num_out.numel() == 0:  # no columns (or no leading rows): nothing to write
        return
    if R == 0:  # zero-height columns: nothing selected, no idx entries
        num_out.zero_()
        return
    m = _flatten_leading(_loadable(block_map))
    cblocks = triton.cdiv(C, block_c)
    grid = (m.shape[0] * cblocks,)
    args = (m, idx_out, num_out, m.stride(0), m.stride(1), m.stride(2), R, C, cblocks)
    if m.is_cuda:
        with torch.cuda.device(m.device):  # Triton launches on the current device
            _k2q_lists_kernel[grid](*args, BLOCK_C=block_c, BLOCK_R=block_r, num_warps=num_warps)
    else:
        _k2q_lists_kernel[grid](*args, BLOCK_C=block_c, BLOCK_R=block_r, num_warps=num_warps)


def k2q_lists_fused(block_map: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Allocating form of :func:`k2q_lists_triton`: ``(idx [..., C, R], num [..., C])``, int32,
    contiguous, on the map's device; ``idx``'s slots past ``num`` are uninitialised (``torch.empty``)."""
    _check_map_dims(block_map)
    *lead, R, C = block_map.shape
    idx = torch.empty((*lead, C, R), dtype=torch.int32, device=block_map.device)
    num = torch.empty((*lead, C), dtype=torch.int32, device=block_map.device)
    k2q_lists_triton(block_map, idx, num)
    return idx, num
