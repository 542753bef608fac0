"""The q2k lists cut by kv range, in one Triton launch (the ``sm90`` forward's ``kv_splits``).

Contract (``adapters.cute_sm90_fwd64.split_lists_by_kv_range``): the input lists are ascending,
int32 ``idx [R, W]`` (``R = B*H*Qb`` rows) with counts ``num [R]`` (clamped to ``[0, W]``; entries
past a row's count are never read). Range ``s`` of ``SPLITS`` is kv tiles ``[ceil(s * KVb /
SPLITS), ceil((s + 1) * KVb / SPLITS))``. Outputs: ``cnt [SPLITS, R]``, each row's number of
entries in each range, and ``out [SPLITS - 1, R, W]``, the lists of ranges 1.. (range 0's list is
the input itself: its entries lead every row), each row's entries of that range moved to the
front in order; slots past the count hold whatever follows in the input row, or 0 past its end
(never read).

Dataflow: one program per ``ROWS`` rows, the whole width (``BLOCK_W = next_power_of_2(W)``) in
registers: the row's valid entries, the count below each boundary (a compare and a row sum), then
per later range one load of the row shifted by its first entry's slot and one store. The input
is read once per range (from the L2 after the first), no host sync, no atomics. Written to replace
eleven torch launches (~270 us at Wan2.1-14B 720p with two ranges, ``vsa_e2e_h200_v23.json``'s
profile); used with ``adapters.cute_sm90_fwd64._TRITON_LISTS`` (on since its GPU test passed on the H200).
This module does not import torch; the launch helper writes into caller-allocated tensors (CPU
tensors under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["kv_range_lists", "MAX_SPLITS"]

MAX_SPLITS = 8


@triton.jit
def _kv_range_lists_kernel(IDX, NUM, OUT, CNT, R, W, KVB,
                           SPLITS: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    r64 = rows.to(tl.int64)
    slots = tl.arange(0, BLOCK_W)
    num = tl.minimum(tl.maximum(tl.load(NUM + r64, mask=rmask, other=0), 0), W)
    in_row = rmask[:, None] & (slots < W)[None, :]
    valid = in_row & (slots[None, :] < num[:, None])
    idx = tl.load(IDX + r64[:, None] * W + slots[None, :], mask=valid, other=0)
    start = tl.zeros([ROWS], dtype=tl.int32)
    for s in tl.static_range(SPLITS):
        if s == SPLITS - 1:
            end = num
        else:
            bound = ((s + 1) * KVB + SPLITS - 1) // SPLITS
            end = tl.sum((valid & (idx < bound)).to(tl.int32), 1)
        tl.store(CNT + s * R + r64, end - start, mask=rmask)
        if s > 0:
            src = slots[None, :] + start[:, None]
            moved = tl.load(IDX + r64[:, None] * W + src, mask=in_row & (src < W), other=0)
            tl.store(OUT + (s - 1) * R * W + r64[:, None] * W + slots[None, :], moved, mask=in_row)
        start = end


def kv_range_lists(idx, num, kvb: int, splits: int, out, cnt, rows_per_program: int = 4) -> None:
    """Write the kv-range lists of ``idx`` / ``num`` (module docstring) into ``out``
    (``[splits - 1, R, W]`` int32, contiguous) and ``cnt`` (``[splits, R]`` int32, contiguous).
    ``idx`` ``[R, W]`` and ``num`` ``[R]`` int32, contiguous; ``2 <= splits <= MAX_SPLITS``."""
    r, w = idx.shape
    if not 2 <= splits <= MAX_SPLITS:
        raise ValueError(f"kv_range_lists: splits must be in [2, {MAX_SPLITS}], got {splits!r}")
    if tuple(out.shape) != (splits - 1, r, w) or tuple(cnt.shape) != (splits, r) or tuple(num.shape) != (r,):
        raise ValueError(f"kv_range_lists: expected out [{splits - 1}, {r}, {w}], cnt [{splits}, {r}], num [{r}]; "
                         f"got {tuple(out.shape)}, {tuple(cnt.shape)}, {tuple(num.shape)}")
    if r == 0:
        return
    grid = (triton.cdiv(r, rows_per_program),)
    _kv_range_lists_kernel[grid](idx, num, out, cnt, r, w, kvb, SPLITS=splits, ROWS=rows_per_program,
                                 BLOCK_W=triton.next_power_of_2(max(w, 1)), num_warps=4)
