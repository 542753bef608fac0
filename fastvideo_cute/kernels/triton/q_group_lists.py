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

Dataflow: one program per row, its valid entries in chunks of ``CHUNK`` (a row's count, not its
width, bounds the loops: k2q lists are allocated ``nb`` wide and hold ~1/8 of it): a first pass
counts each group's members (a one-hot ``[CHUNK, GROUPS]`` sum), their exclusive prefix is the
groups' first slots (the bounds, stored), a second pass gives each member its group's next slot
(a prefix sum down the one-hot columns) and stores it there. No host sync, no atomics. Written to
replace the torch ops of the sort-based split (a segmented sort of the padded rows, ``where``,
``searchsorted``: ~0.4 ms a call at 65,536 tokens, ``prof_bwd64_kernels_h200.json``; the first,
whole-width version of this kernel took 0.125 ms there, ``prof_bwd64_kernels_h200_v2.json``).
This module does not import torch; the launch helper writes into caller-allocated tensors (CPU
tensors under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["q_group_lists", "MAX_GROUPS"]


#: the most groups one launch splits into (the group ids are a vector of this many lanes)
MAX_GROUPS = 64


@triton.jit
def _q_group_lists_kernel(IDX, NUM, OUT, GB, W, GROUP, GROUPS, CHUNK: tl.constexpr, G: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    num = tl.minimum(tl.maximum(tl.load(NUM + r), 0), W)
    gid = tl.arange(0, G)
    counts = tl.zeros([G], dtype=tl.int32)
    for c in range(0, num, CHUNK):
        slots = c + tl.arange(0, CHUNK)
        valid = slots < num
        idx = tl.load(IDX + r * W + slots, mask=valid, other=0)
        grp = tl.minimum(tl.maximum(idx // GROUP, 0), GROUPS - 1)
        onehot = ((grp[:, None] == gid[None, :]) & valid[:, None]).to(tl.int32)
        counts += tl.sum(onehot, 0)
    ends = tl.cumsum(counts, 0)
    tl.store(GB + r * (GROUPS + 1), 0)
    tl.store(GB + r * (GROUPS + 1) + 1 + gid, ends, mask=gid < GROUPS)
    nxt = ends - counts
    for c in range(0, num, CHUNK):
        slots = c + tl.arange(0, CHUNK)
        valid = slots < num
        idx = tl.load(IDX + r * W + slots, mask=valid, other=0)
        grp = tl.minimum(tl.maximum(idx // GROUP, 0), GROUPS - 1)
        onehot = ((grp[:, None] == gid[None, :]) & valid[:, None]).to(tl.int32)
        rank = tl.cumsum(onehot, 0) - 1 + nxt[None, :]
        pos = tl.sum(tl.where(onehot != 0, rank, 0), 1)
        tl.store(OUT + r * W + pos, idx, mask=valid)
        nxt += tl.sum(onehot, 0)


def q_group_lists(idx, num, group: int, groups: int, out, gb, chunk: int = 128) -> None:
    """Write the lists of ``idx`` / ``num`` partitioned by q group (module docstring) into ``out``
    (``[R, W]`` int32, contiguous, not ``idx`` itself) and ``gb`` (``[R, groups + 1]`` int32,
    contiguous). ``idx`` ``[R, W]`` and ``num`` ``[R]`` int32, contiguous; ``group`` >= 1,
    ``1 <= groups <= MAX_GROUPS``; ``chunk``: entries per loop step (a power of two)."""
    r, w = idx.shape
    if group < 1 or not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"q_group_lists: group must be >= 1 and groups in [1, {MAX_GROUPS}], got {group!r}, {groups!r}")
    if chunk < 1 or chunk & (chunk - 1):
        raise ValueError(f"q_group_lists: chunk must be a power of two, got {chunk!r}")
    if tuple(out.shape) != (r, w) or tuple(gb.shape) != (r, groups + 1) or tuple(num.shape) != (r,):
        raise ValueError(f"q_group_lists: expected out [{r}, {w}], gb [{r}, {groups + 1}], num [{r}]; "
                         f"got {tuple(out.shape)}, {tuple(gb.shape)}, {tuple(num.shape)}")
    if out.data_ptr() == idx.data_ptr() and w:
        raise ValueError("q_group_lists: out must not be idx (the rows are read while written)")
    if r == 0:
        return
    _q_group_lists_kernel[(r,)](idx, num, out, gb, w, group, groups, CHUNK=chunk,
                                G=max(2, triton.next_power_of_2(groups)), num_warps=4)
