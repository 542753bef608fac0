"""The k2q lists partitioned by q group, in one Triton launch (the Hopper 64-token backward's q
groups, ``adapters.cute_sm90_bwd64_ws.group_bounds``).

Contract: int32 ``idx [R, W]`` (``R = B*H*nb`` kv items, each row a k2q list of q blocks) with
counts ``num [R]`` (clamped to ``[0, W]``; entries past a row's count are never read). Group ``g``
of ``GROUPS`` is q blocks ``[g * GROUP, (g + 1) * GROUP)``; an entry below 0 counts as group 0,
one at or past ``GROUPS * GROUP`` as the last group (the caller's validation keeps entries in
``[0, nb)``, so neither happens on the routes). Outputs: ``out [R, W]``, each row's valid entries
moved so that group ``g``'s come in slots ``gb[r, g] .. gb[r, g + 1] - 1``, in the order they had
in the row (a stable partition: an ascending list, as ``metadata.map_to_index`` builds them,
stays ascending); slots past the count are left as they were (never read); and ``gb [R, GROUPS +
1]``, the bounds (``gb[r, 0] = 0``, ``gb[r, GROUPS] = num[r]`` clamped).

Dataflow: one program per ``ROWS`` rows, the whole width (``BLOCK_W = next_power_of_2(W)``) in
registers: the row's valid entries and their groups, then per group a prefix sum of its members
(each member's slot) and one masked store. The input is read once, no host sync, no atomics.
Written to replace the torch ops of the sort-based split (a segmented sort of the padded rows,
``where``, ``searchsorted``: ~0.4 ms a call at 65,536 tokens, ``prof_bwd64_kernels_h200.json``).
This module does not import torch; the launch helper writes into caller-allocated tensors (CPU
tensors under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["q_group_lists"]


@triton.jit
def _q_group_lists_kernel(IDX, NUM, OUT, GB, R, W, GROUP, GROUPS, ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    r64 = rows.to(tl.int64)
    slots = tl.arange(0, BLOCK_W)
    num = tl.minimum(tl.maximum(tl.load(NUM + r64, mask=rmask, other=0), 0), W)
    valid = rmask[:, None] & (slots[None, :] < num[:, None])
    idx = tl.load(IDX + r64[:, None] * W + slots[None, :], mask=valid, other=0)
    grp = tl.minimum(tl.maximum(idx // GROUP, 0), GROUPS - 1)
    start = tl.zeros([ROWS], dtype=tl.int32)
    tl.store(GB + r64 * (GROUPS + 1), start, mask=rmask)
    for g in range(GROUPS):
        member = valid & (grp == g)
        m = member.to(tl.int32)
        slot = start[:, None] + tl.cumsum(m, 1) - 1
        tl.store(OUT + r64[:, None] * W + slot, idx, mask=member)
        start += tl.sum(m, 1)
        tl.store(GB + r64 * (GROUPS + 1) + g + 1, start, mask=rmask)


def q_group_lists(idx, num, group: int, groups: int, out, gb, rows_per_program: int = 4) -> None:
    """Write the lists of ``idx`` / ``num`` partitioned by q group (module docstring) into ``out``
    (``[R, W]`` int32, contiguous, not ``idx`` itself) and ``gb`` (``[R, groups + 1]`` int32,
    contiguous). ``idx`` ``[R, W]`` and ``num`` ``[R]`` int32, contiguous; ``group``, ``groups`` >= 1."""
    r, w = idx.shape
    if group < 1 or groups < 1:
        raise ValueError(f"q_group_lists: group and groups must be >= 1, got {group!r}, {groups!r}")
    if tuple(out.shape) != (r, w) or tuple(gb.shape) != (r, groups + 1) or tuple(num.shape) != (r,):
        raise ValueError(f"q_group_lists: expected out [{r}, {w}], gb [{r}, {groups + 1}], num [{r}]; "
                         f"got {tuple(out.shape)}, {tuple(gb.shape)}, {tuple(num.shape)}")
    if out.data_ptr() == idx.data_ptr() and w:
        raise ValueError("q_group_lists: out must not be idx (the rows are read while written)")
    if r == 0:
        return
    grid = (triton.cdiv(r, rows_per_program),)
    _q_group_lists_kernel[grid](idx, num, out, gb, r, w, group, groups, ROWS=rows_per_program,
                                BLOCK_W=triton.next_power_of_2(max(w, 1)), num_warps=4)
