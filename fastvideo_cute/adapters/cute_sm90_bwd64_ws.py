"""The chain around the warp-specialized Hopper main kernel of the 64-token VSA backward
(``kernels/cute/block_sparse_bwd64/block_sparse_bwd64_sm90_ws.py``).

The stages of :func:`fastvideo_cute.adapters.cute_sm100_bwd.run_bwd64_chain` (preprocess, work
order, main, postprocess) with one addition, q groups: when a sequence has ``GROUP_MIN_BLOCKS``
q blocks or more (and more than ``group_blocks``), every kv block's k2q list is split at multiples of ``group_blocks`` q
blocks and each part gets its own CTA, ordered so that the CTAs resident together read Q/dO and
reduce dQ within one head's q group (``group_blocks`` rows of 64 tokens: 512 keeps that group's
Q, dO and dq_accum, 8 + 8 + 16 MB, inside the H200's 50 MB L2, where a whole head at 65,536
tokens, 16 + 16 + 32 MB, is not). The parts' dK/dV are then added into fp32 accumulators (zeroed here, one
allocation for both) and converted to bf16 after the main kernel, or, with a ``ticket_dkv`` build (the
route's), summed inside the kernel by the group that finishes last, which writes the bf16 rows (an
fp32 workspace and zeroed counters here instead); with one group they are written once, in bf16, by
the kernel. The split partitions each list's valid entries by group in one
Triton launch (:func:`group_bounds`; a caller's order does not matter), and a grouped chain skips
the work order (its CTAs take the items in (head, group, kv) order). Inputs were checked by the
caller's support predicate.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from fastvideo_cute.kernels.cute.block_sparse_bwd64.limits import HEAD_DIM, TICKET_COUNTERS, TICKET_WS_FLOATS

from fastvideo_cute.kernels.triton.q_group_lists import MAX_GROUPS, q_group_lists

from .cute_sm100_bwd import ORDER_POLICIES, sm100_bwd64_common_stages, sm100_bwd64_postprocess

__all__ = ["GROUP_BLOCKS_DEFAULT", "GROUP_MIN_BLOCKS", "H100_PAIR_MIN_BLOCKS", "default_groups", "group_bounds",
           "run_ws_chain"]

#: q blocks per group: measured on the H200 at 65,536 tokens with the route's flat_dq build
#: (benchmarks/results/bwd64_sm90_h200_v20.json, per-round ratio to cuDNN's blk64 backward): 512 (two
#: groups) 1.022x, 448 1.007x, 384 (cuDNN's bucket, the default before) 0.999x, 320 0.972x, 256 0.962x
GROUP_BLOCKS_DEFAULT = 512
#: sequences with fewer q blocks than this are not split (one group): measured on the H200
#: (benchmarks/results/bwd64_sm90_h200_v7.json), groups of 384 cost 14 % at 32,768 tokens (512 blocks:
#: one whole head's Q, dO and dq_accum, 3 x 16 MB, already stays in L2) and 7 % on the Wan-1.3B grid
#: (624), and gain 8.6 % at 65,536 (1024)
GROUP_MIN_BLOCKS = 768
#: on an H100 (HBM3, 3.35 TB/s against the H200's 4.8: an L2 miss costs more), sequences of this many q
#: blocks up to GROUP_MIN_BLOCKS are split into two equal groups. Measured on the H100 with the route's
#: flat_dq build (benchmarks/results/bwd64_sm90_h100_groups.json, _groups2.json, 2026-12-05): on the
#: Wan-1.3B grid (624 blocks: one head's Q, dO and dq_accum 39 MB, 0.78 of the 50 MB L2) two groups of 312
#: took 7.62 / 7.63 ms against 8.03 / 8.04 ms for one group (1.008x cuDNN's blk64 backward instead of
#: 0.956x); at 32,768 tokens (512 blocks: 32 MB, 0.64 of the L2) two groups of 256 cost 3.9 % (5.37 vs
#: 5.17 ms). 576 (36 MB, 0.72) lies between the two points; other GPUs keep the H200's rule above (the
#: H200 was not measured with this split).
H100_PAIR_MIN_BLOCKS = 576
#: the q-group split by one Triton launch on CUDA (else the torch ops of ``_group_lists_torch``)
_TRITON_GROUPS = True


def default_groups(num_blocks: int, gpu_name: str) -> Tuple[Optional[int], int]:
    """``(group_blocks, min_blocks)`` of :func:`group_bounds` for a sequence of ``num_blocks``
    64-token q blocks on the GPU named ``gpu_name`` (:func:`device_name`): two equal
    groups on an H100 from ``H100_PAIR_MIN_BLOCKS`` to ``GROUP_MIN_BLOCKS`` blocks, else groups of
    ``GROUP_BLOCKS_DEFAULT`` from ``GROUP_MIN_BLOCKS`` blocks on."""
    if "H100" in gpu_name and H100_PAIR_MIN_BLOCKS <= num_blocks < GROUP_MIN_BLOCKS:
        return -(-num_blocks // 2), 0
    return GROUP_BLOCKS_DEFAULT, GROUP_MIN_BLOCKS


@functools.lru_cache(maxsize=None)
def device_name(index: int) -> str:
    """The CUDA device's name, looked up once per device."""
    return torch.cuda.get_device_name(index)


def group_bounds(k2q_idx: torch.Tensor, k2q_num: torch.Tensor, num_blocks: int, group_blocks: Optional[int],
                 min_blocks: int = 0):
    """``(idx, gb)``: the lists (int32 ``[items, max_q]``, each row's valid entries partitioned by q
    group, their order within a group kept: ascending lists stay ascending) and the group bounds
    (int32 ``[items, groups + 1]``, group ``g`` of item ``i`` is ``idx[i, gb[i, g]:gb[i, g + 1]]``:
    its q blocks in ``[g * group_blocks, (g + 1) * group_blocks)``). One group (``gb = [0, num]``, the
    lists as given) when ``group_blocks`` is None or at least ``num_blocks``, or ``num_blocks`` is below
    ``min_blocks``. On CUDA with ``_TRITON_GROUPS`` one Triton launch
    (``kernels/triton/q_group_lists``, up to its ``MAX_GROUPS`` groups), else torch ops (a stable sort by group); slots past a
    row's count differ between the two, never read."""
    items = k2q_num.numel()
    idx = k2q_idx.to(torch.int32).reshape(items, k2q_idx.shape[-1]).contiguous()
    num = k2q_num.to(torch.int32).reshape(items).contiguous()
    if group_blocks is None or group_blocks >= num_blocks or num_blocks < min_blocks or idx.shape[1] == 0:
        return idx, torch.stack([torch.zeros_like(num), num], dim=1).contiguous()
    if group_blocks < 1:
        raise ValueError(f"group_blocks must be >= 1 or None, got {group_blocks}")
    groups = -(-num_blocks // group_blocks)
    if _TRITON_GROUPS and idx.is_cuda and groups <= MAX_GROUPS:
        out = torch.empty_like(idx)
        gb = torch.empty((items, groups + 1), dtype=torch.int32, device=idx.device)
        with torch.cuda.device(idx.device):
            q_group_lists(idx, num, group_blocks, groups, out, gb)
        return out, gb
    return _group_lists_torch(idx, num, group_blocks, groups)


def _group_lists_torch(idx: torch.Tensor, num: torch.Tensor, group_blocks: int, groups: int):
    """:func:`group_bounds`'s split by torch ops: each row's entries stably sorted by group (slots
    past the count as the last group + 1, so they stay behind), the bounds counted per group."""
    used = torch.arange(idx.shape[1], device=idx.device) < num.clamp(0, idx.shape[1])[:, None]
    grp = torch.where(used, (idx // group_blocks).clamp(0, groups - 1), groups)
    key, perm = torch.sort(grp, dim=1, stable=True)
    ordered = torch.gather(idx, 1, perm).contiguous()
    edges = torch.arange(groups + 1, device=idx.device, dtype=key.dtype).expand(idx.shape[0], -1).contiguous()
    return ordered, torch.searchsorted(key.contiguous(), edges).to(torch.int32).contiguous()


def run_ws_chain(compiled, q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes, sm_scale: float,
                 order_policy: str = "auto", group_blocks: Optional[int] = GROUP_BLOCKS_DEFAULT,
                 group_min_blocks: int = GROUP_MIN_BLOCKS, dq_frag: bool = False, ticket_dkv: bool = False):
    """The backward through the warp-specialized main kernel; returns ``(dq, dk, dv)``.
    ``compiled(grouped)``: the main kernel compiled with ``grouped`` (fp32 dk/dv accumulators) or
    without. ``order_policy``: with one group, the work order (``cute_sm100_bwd.ORDER_POLICIES``);
    ``group_blocks`` / ``group_min_blocks``: the q groups (:func:`group_bounds`); ``dq_frag``: the main kernel
    was built with ``flat_dq`` (dq_accum tiles in its register order: the matching postprocess);
    ``ticket_dkv``: the main kernel was built with ``ticket_dkv`` (called as ``compiled(False)`` also with q
    groups: the group that finishes last writes the bf16 dk/dv rows; the chain gives it an fp32
    workspace and zeroed counters instead of zeroed accumulators and a conversion pass)."""
    if order_policy not in ORDER_POLICIES:
        raise ValueError(f"order_policy must be one of {ORDER_POLICIES}, got {order_policy!r}")
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0:
        return dq, dk, dv
    batch, heads, _, _ = q.shape
    nb = kv_block_sizes.numel()
    items = batch * heads * nb
    idx, gb = group_bounds(k2q_idx, k2q_num, nb, group_blocks, group_min_blocks)
    grouped = gb.shape[1] > 2
    common = sm100_bwd64_common_stages(out, dout, lse, k2q_num, kv_block_sizes, dk=dk, dv=dv,
                                       with_order=order_policy == "auto" and not grouped)
    order = common["order"]
    if order is None:
        order = torch.arange(items, dtype=torch.int32, device=q.device)
    num = k2q_num.to(torch.int32).reshape(items).contiguous()
    vbs = kv_block_sizes.to(torch.int32).contiguous()
    accumulate = grouped and not ticket_dkv  # fp32 accumulators, converted after the kernel
    if accumulate:
        dk_out, dv_out = torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device).unbind(0)
    else:
        dk_out, dv_out = dk, dv
    if ticket_dkv and grouped:
        ws = torch.empty(items * TICKET_WS_FLOATS, dtype=torch.float32, device=q.device)
        tk = torch.zeros(items * TICKET_COUNTERS, dtype=torch.int32, device=q.device)
    else:  # not read
        ws = torch.empty(4, dtype=torch.float32, device=q.device)
        tk = torch.empty(1, dtype=torch.int32, device=q.device)
    with torch.cuda.device(q.device):
        compiled(accumulate)(q.view(-1, HEAD_DIM), k.view(-1, HEAD_DIM), v.view(-1, HEAD_DIM), dout.view(-1, HEAD_DIM),
                             dk_out.view(-1, HEAD_DIM), dv_out.view(-1, HEAD_DIM), common["dq_accum"].view(-1, HEAD_DIM),
                             common["lse2"].view(-1), common["delta"].view(-1), idx, num, vbs, order, gb, ws, tk,
                             float(sm_scale))
    if accumulate:
        dk.copy_(dk_out)
        dv.copy_(dv_out)
    sm100_bwd64_postprocess(common["dq_accum"], lse, sm_scale, dq=dq, frag_order=dq_frag)
    return dq, dk, dv
