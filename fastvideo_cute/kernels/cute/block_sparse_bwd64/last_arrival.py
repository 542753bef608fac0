# SPDX-License-Identifier: Apache-2.0
"""dK / dV of a kv block split over q groups, summed by the group that finishes last (the warp-
specialized Hopper backward's ``ticket_dkv``; device side only, no torch).

With q groups, several CTAs (one per group that holds a part of the kv block's k2q list) each end
with a partial 64 x 128 fp32 tile of the same dK (or dV). Instead of adding every part into a
zeroed fp32 accumulator and converting it to bf16 afterwards (two extra passes over
``B*H*S*128*4`` bytes per tensor), each warp of a consumer warpgroup (16 of the tile's rows) takes a
ticket from its own counter:

    ticket 0            stores its part (times the scale) into the workspace slot, in register
                        order (16 128-bit stores a thread: a warp's cover 512 contiguous bytes), then
                        releases it: fence.acq_rel.gpu, then ``done += 1`` (release)
    0 < ticket < n - 1  waits for ``done >= 1`` (the slot holds ticket 0's part), adds its part by
                        fp32 reductions, releases it (``done += 1``)
    ticket n - 1        waits for ``done == n - 1`` (acquire), reads the slot, adds its own part and
                        writes the bf16 rows once (rows of padded keys exactly 0)

``n`` is the number of the kv block's groups that hold at least one q block (CTAs with an empty
part exit before their loops and take no ticket); with ``n == 1`` the rows are written directly,
as without q groups. A waiting warp only waits on warps that already took a ticket, so they are
resident and finish: no deadlock whatever order the CTAs run in. The counters
(``[items, 2, 4, 2]`` int32, ``limits.TICKET_COUNTERS`` per item: tensor, warp, ticket/done) must be zero at launch (the host zeroes them).
The sum's order follows the tickets, so dK / dV are not bitwise run to run with several groups
(neither were the accumulators'); with one group they are.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from .limits import BLOCK, HEAD_DIM, TICKET_COUNTERS

__all__ = ["TILE", "group_parts", "add_rows_last_arrival"]

TILE = BLOCK * HEAD_DIM  # floats of one kv block's dK (or dV) tile in the workspace
WG = 128


@cute.jit
def group_parts(mGB: cute.Tensor, item, num) -> Int32:
    """How many of item ``item``'s q groups hold at least one entry of its k2q list (the kernel's own
    clamping of the ``gb`` bounds: ``count > 0`` exactly when that group's CTA does work)."""
    parts = Int32(0)
    for g in cutlass.range(cute.size(mGB.shape[1]) - 1, unroll=1):
        base = cutlass.min(cutlass.max(mGB[item, g], Int32(0)), num)
        count = cutlass.min(cutlass.max(mGB[item, g + 1], base), num) - base
        if count > 0:
            parts += 1
    return parts


@cute.jit
def add_rows_last_arrival(acc: cute.Tensor, scale: Float32, parts: Int32, mWs: cute.Tensor, mTk: cute.Tensor,
                          item, items, tensor: cutlass.Constexpr, wtid) -> cutlass.Boolean:
    """This warp's share of the sum over ``parts`` groups (module docstring). ``acc``: the thread's
    64 accumulator registers (an m64n128 fp32 fragment), scaled by ``scale`` here; ``tensor``: 0 for
    dK, 1 for dV (its workspace half and counters). Returns True in the warp that holds the whole
    sum in ``acc`` (scaled) and must write the rows; the others have handed their part over."""
    warp = wtid // 32
    lane = wtid % 32
    for i in cutlass.range_constexpr(cute.size(acc)):
        acc[i] = acc[i] * scale
    counter = mTk.iterator + item * TICKET_COUNTERS + (tensor * 4 + warp) * 2
    ticket = Int32(0)
    if lane == 0:
        ticket = cute.arch.atomic_add(counter, Int32(1), sem="relaxed", scope="gpu")
    ticket = cute.arch.shuffle_sync(ticket, 0)
    off = (Int64(tensor) * Int64(items) + Int64(item)) * TILE + Int64(wtid * 4)
    slot = mWs.iterator + cute.assume(off, divby=4)
    gview = cute.make_tensor(slot, cute.make_layout((4, 16), stride=(1, 4 * WG)))
    rview = cute.make_tensor(acc.iterator, cute.make_layout((4, 16), stride=(1, 4)))
    last = ticket == parts - 1
    if ticket == 0:
        cute.autovec_copy(rview, gview)
    else:
        need = Int32(1)
        if last:
            need = parts - 1
        if lane == 0:
            seen = cute.arch.atomic_add(counter + 1, Int32(0), sem="acquire", scope="gpu")
            while seen < need:
                seen = cute.arch.atomic_add(counter + 1, Int32(0), sem="acquire", scope="gpu")
        cute.arch.sync_warp()
        cute.arch.fence_acq_rel_gpu()
        if last:
            part = cute.make_rmem_tensor_like(acc)
            pview = cute.make_tensor(part.iterator, cute.make_layout((4, 16), stride=(1, 4)))
            cute.autovec_copy(gview, pview)
            for i in cutlass.range_constexpr(cute.size(acc)):
                acc[i] = acc[i] + part[i]
        else:
            for i in cutlass.range_constexpr(16):
                for e in cutlass.range_constexpr(4):
                    cute.arch.atomic_add(slot + (i * 4 * WG + e), rview[e, i])
    if not last:  # release this warp's part
        cute.arch.fence_acq_rel_gpu()
        cute.arch.sync_warp()
        if lane == 0:
            cute.arch.atomic_add(counter + 1, Int32(1), sem="release", scope="gpu")
    return last
