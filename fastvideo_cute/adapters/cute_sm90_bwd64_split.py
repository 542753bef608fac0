"""The split 64-token backward on Hopper (2026-12-07; the sm90 backend runs it for q2k lists that arrive
as lists, ``backends/sm90_backend._split_plan``).

The route's backward (``cute_sm90_bwd64_ws``) reduce-adds one 32 KB fp32 dQ tile per (q block, kv
block) pair into ``dq_accum``; its Nsight Compute profile has the SM-to-L2 path 92.5 % busy with them
(``docs/hopper-64-token.md``). Here the kv-owned main kernel, built with ``ds_out``, stores each pair's
bf16 dS tile instead (8 KB, in q-owned order: slot ``qoff[q item] + rank of the kv block in the q
block's ascending list``), and the q-owned ``BlockSparseDq64Sm90`` sums ``dq = scale * sum_j dS_ij K_j``
in registers (one fixed order: dq is the same bits run to run) and writes bf16 rows; no dq_accum
reduction, no postprocess. The cost is a workspace of 8 KB a pair, sized by the q2k lists' width
without a device sync (3.2 GB at 32,768 tokens, B = 1, H = 12, 87.5 % sparse, lists as wide as top-k),
the heads in chunks that fit ``WORKSPACE_CAP``; both kernels address it through its base pointer (the
tensors passed are its first elements: its length can pass the int32 range of a tensor argument's
shape). One q group unless ``q_groups`` asks for more; the slots by one Triton launch
(``kernels/triton/pair_slots``) or torch ops.
Inputs as :func:`cute_sm90_bwd64.sm90_block_sparse_bwd64`'s, plus the q2k lists (ascending).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from fastvideo_cute.kernels.cute import block_sparse_bwd64 as _kernels  # names and limits only: no CuTe import
from fastvideo_cute.kernels.cute.block_sparse_bwd64.limits import BLOCK, HEAD_DIM, TICKET_COUNTERS, TICKET_WS_FLOATS

from fastvideo_cute.kernels.triton.pair_slots import pair_slots_triton

from ._checks import check_block_lists
from .cute_sm100_bwd import sm100_bwd64_common_stages, work_order
from .cute_sm90_bwd64 import sm90_bwd64_support
from .cute_sm90_bwd64_ws import default_groups, device_name, group_bounds

__all__ = ["DQ_CONFIG", "SPLIT_MAIN_CONFIG", "WORKSPACE_CAP", "head_chunks", "pair_chunks", "pair_slots",
           "sm90_block_sparse_bwd64_split", "sm90_bwd64_split_support"]

#: the main kernel's build: the route's (``backends/sm90_backend._BWD_WS_CONFIG``) with ``ds_out`` and
#: ``ds_evict_first`` (the dS tiles stored with the L2 policy evict_first; see :data:`DQ_CONFIG`)
SPLIT_MAIN_CONFIG = {"narrow_dq": True, "p_stages": 2, "flat_dq": True, "zero_pad_v": True, "ticket_dkv": True,
                     "tma_dkv": True, "ds_out": True, "grouped": False, "ds_evict_first": True}
#: the dQ kernel's build (``BlockSparseDq64Sm90``'s configuration): a 4-slot ring at two CTAs per SM (the
#: kernel's defaults), the dS tiles loaded evict_first. Ring and CTAs measured on H100s through this adapter
#: against cuDNN's blk64 backward in the same rounds
#: (benchmarks/results/bwd64_split_h100_s31{a,b,c}.json, s32a.json; s32a's entries settled, five rounds):
#: against the 3-slot ring at three CTAs per SM, +1.1 / +1.1 / -2.0 / +2.8 % at 32,768 tokens, +3.7 / +1.2 /
#: -3.2 / +1.8 % on the Wan-1.3B grid, +15.8 / +13.7 / +5.1 / -0.4 % at 65,536 (a, b, c unsettled). The same
#: bits either way (the order of the sum does not depend on the ring). The L2 hint (dS stored by the main
#: kernel and loaded here evict_first; the same bits) against none, H100, three runs of settled rounds
#: (benchmarks/results/bwd64_split_h100_hints{,_s34,_s34b}.json, 2026-12-07), medians: +1.7 / +4.2 / +1.9 %
#: at 65,536 tokens, +1.2 / -1.2 / -1.0 % at 32,768, +2.4 / -0.6 / -0.9 % on the Wan-1.3B grid (even there,
#: within the rounds' spread); K loaded evict_last as well (``k_evict_last``): nothing consistent, left off.
DQ_CONFIG = {"stages": 4, "ctas_per_sm": 2, "ds_evict_first": True}
DS_TILE_ELEMS = BLOCK * BLOCK
#: bf16 elements of the workspace that ``ticket_dkv`` takes per kv block with q groups (its fp32 dK and dV parts)
TICKET_ELEMS = 2 * TICKET_WS_FLOATS
#: the dS workspace's bytes at most (one (batch, head) sequence's, if that is more): the heads run in
#: chunks that fit it
WORKSPACE_CAP = 4 << 30
#: the slots by one Triton launch on CUDA (``kernels/triton/pair_slots``), else by :func:`pair_slots`
_TRITON_SLOTS = True


def chunk_slots(qi, qn, ki, kn, nb: int):
    """``(qoff, slots)`` of one chunk's lists (``[S, nb, W]`` / ``[S, nb]``, int32): one Triton launch
    on CUDA with ``_TRITON_SLOTS``, else :func:`pair_slots`'s torch ops (the same values where read)."""
    if not (_TRITON_SLOTS and qi.is_cuda):
        return pair_slots(qi.unsqueeze(0), qn.unsqueeze(0), ki.unsqueeze(0), nb)
    r = qn.numel()
    qnum = qn.reshape(r).contiguous()
    qoff = (torch.cumsum(qnum, 0, dtype=torch.int32) - qnum).contiguous()
    kidx = ki.reshape(r, -1).contiguous()
    slots = torch.empty_like(kidx)
    pair_slots_triton(kidx, kn.reshape(r).contiguous(), qi.reshape(r, -1).contiguous(), qnum, qoff, slots, nb)
    return qoff, slots


def pair_slots(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, k2q_idx: torch.Tensor,
               num_kv_blocks: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(qoff, slots)``: int32 ``[B*H*nq]``, the exclusive prefix of the q2k counts, and int32
    ``[B*H*nk, W]``, each k2q entry's slot in q-owned order (``qoff`` of its q block plus the rank of
    the kv block in that q block's ascending list); slots past a k2q list's count hold in-range values
    that are never read. Lists ``[B, H, n, W]``; entries past a count are ignored."""
    b, h, nq, w = q2k_idx.shape
    num = q2k_num.to(torch.int64).reshape(b, h, nq)
    valid = torch.arange(w, device=q2k_idx.device) < num[..., None]
    col = torch.where(valid, q2k_idx.to(torch.int64).clamp(0, num_kv_blocks - 1), num_kv_blocks)
    sel = torch.zeros(b, h, nq, num_kv_blocks + 1, dtype=torch.int32, device=q2k_idx.device)
    sel.scatter_(-1, col, 1)
    rank = sel[..., :num_kv_blocks].cumsum(-1) - 1  # [B, H, nq, nk]
    flat = num.reshape(-1)
    qoff = torch.cumsum(flat, 0) - flat
    i = k2q_idx.to(torch.int64).clamp(0, nq - 1)  # [B, H, nk, W']
    r = rank.transpose(-1, -2).gather(-1, i).clamp(min=0)
    base = qoff.view(b, h, 1, nq).expand(b, h, num_kv_blocks, nq).gather(-1, i)
    return qoff.to(torch.int32), (base + r).to(torch.int32).reshape(b * h * num_kv_blocks, -1).contiguous()


def head_chunks(pairs_per_head: int, heads: int, cap_bytes: int):
    """``[(h0, h1), ...]``: consecutive ranges of the ``heads`` flattened (batch, head) sequences whose
    workspaces (``pairs_per_head`` 8 KB tiles each, at most) fit ``cap_bytes`` together; one sequence
    a chunk at least."""
    per = max(1, cap_bytes // max(1, pairs_per_head * DS_TILE_ELEMS * 2))
    return [(h0, min(h0 + per, heads)) for h0 in range(0, heads, per)]


def pair_chunks(seq_pairs, cap_bytes: int):
    """``[(h0, h1), ...]``: consecutive ranges of the (batch, head) sequences, whose dS tiles number
    ``seq_pairs[i]`` (host ints, exact), that fit ``cap_bytes`` together; one sequence a chunk at
    least."""
    tile = DS_TILE_ELEMS * 2
    chunks, h0, acc = [], 0, 0
    for i, p in enumerate(seq_pairs):
        if i > h0 and (acc + p) * tile > cap_bytes:
            chunks.append((h0, i))
            h0, acc = i, 0
        acc += p
    chunks.append((h0, len(seq_pairs)))
    return chunks


def sm90_bwd64_split_support(q, k, v, out, dout, lse, q2k_idx, q2k_num, k2q_idx, k2q_num, kv_block_sizes):
    """``(True, "")`` iff :func:`sm90_block_sparse_bwd64_split` can run these tensors here, else ``(False,
    reason)``: the q2k lists (``[B, H, nb, W >= 1]``, ``[B, H, nb]``), then the route's checks
    (:func:`cute_sm90_bwd64.sm90_bwd64_support`: BHSD bf16 CUDA tensors of one shape, so q_len == kv_len,
    an sm_90 GPU, the k2q lists, the sizes); static facts only."""
    ok, reason = check_block_lists(q, "q2k_idx", q2k_idx, "q2k_num", q2k_num, kv_block_sizes, BLOCK, min_width=1)
    if not ok:
        return ok, reason
    return sm90_bwd64_support(q, k, v, out, dout, lse, k2q_idx, k2q_num, kv_block_sizes)


def sm90_block_sparse_bwd64_split(q, k, v, out, dout, lse, q2k_idx, q2k_num, k2q_idx, k2q_num, kv_block_sizes,
                                  sm_scale: Optional[float] = None, dq_config: Optional[dict] = None, slots=None,
                                  workspace_cap: int = WORKSPACE_CAP, seq_pairs=None, q_groups=None,
                                  main_config: Optional[dict] = None):
    """``(dq, dk, dv)`` by the split chain (module docstring): preprocess, then per chunk of (batch,
    head) sequences whose dS workspace fits ``workspace_cap`` bytes (:func:`head_chunks`; the bound is the
    lists' width, no device sync) the main kernel (``ds_out``) and the dQ kernel. Self-attention layout (q
    and kv blocks alike, ``kv_block_sizes`` for both), BHSD, bf16, head_dim 128. ``slots``:
    :func:`pair_slots`'s result for these lists, if the caller has it (one chunk only). ``seq_pairs``:
    each (batch, head) sequence's pair count (``q2k_num`` summed; host ints, exact), if the caller has
    it: the workspace and the chunks are sized by it (:func:`pair_chunks`) instead of the width.
    ``dq_config``: the dQ kernel's configuration (default :data:`DQ_CONFIG`; a bad one raises the
    kernel's ``ValueError``, before any launch); ``main_config``: options merged into the main kernel's
    :data:`SPLIT_MAIN_CONFIG` (e.g. ``{"ds_evict_first": False}``; a bad one raises the kernel's ``ValueError``,
    before any launch). ``q_groups``: None (one q group: each kv block's CTA walks
    its whole k2q list), ``"auto"`` (:func:`cute_sm90_bwd64_ws.default_groups`, the route's rule) or the
    q blocks per group; with several groups the main kernel's CTAs that run together read one head's q
    group (as the route's), the group that finishes a kv block last writes its dk/dv rows (``ticket_dkv``:
    dk/dv are then not bitwise run to run; dq is, and equals the one-group chain's), and the workspace
    and the slots' buffer hold the ticket's part first. Raises
    ``ValueError`` naming the reason, before any launch, when :func:`sm90_bwd64_split_support` refuses."""
    if not (q_groups is None or (isinstance(q_groups, str) and q_groups == "auto")
            or (isinstance(q_groups, int) and not isinstance(q_groups, bool) and q_groups > 0)):
        raise ValueError(f"sm90_block_sparse_bwd64_split: q_groups must be None, 'auto' or a positive int, "
                         f"got {q_groups!r}")
    ok, reason = sm90_bwd64_split_support(q, k, v, out, dout, lse, q2k_idx, q2k_num, k2q_idx, k2q_num, kv_block_sizes)
    if not ok:
        raise ValueError(f"sm90_block_sparse_bwd64_split: {reason}")
    dq_maker = _kernels.sm90_dq_from_ds_kernel(**(DQ_CONFIG if dq_config is None else dq_config))
    main_maker = _kernels.sm90_ws_main_kernel(**{**SPLIT_MAIN_CONFIG, **(main_config or {})})
    if sm_scale is None:
        sm_scale = HEAD_DIM**-0.5
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0:
        return dq, dk, dv
    b, h, s, d = q.shape
    nb = kv_block_sizes.numel()
    bh = b * h
    if seq_pairs is None:
        per_seq = q2k_idx.shape[-1] * nb  # pairs of one (batch, head) sequence, at most
        chunks = head_chunks(per_seq, bh, workspace_cap)
        ws_pairs = per_seq * (chunks[0][1] - chunks[0][0])
    else:
        if len(seq_pairs) != bh:
            raise ValueError(f"sm90_block_sparse_bwd64_split: seq_pairs needs {bh} counts (B*H), "
                             f"got {len(seq_pairs)}")
        chunks = pair_chunks(seq_pairs, workspace_cap)
        ws_pairs = max(1, max(sum(seq_pairs[h0:h1]) for h0, h1 in chunks))
    if q_groups == "auto":
        group_blocks, min_blocks = default_groups(nb, device_name(q.device.index if q.device.index is not None
                                                                   else torch.cuda.current_device()))
    else:
        group_blocks, min_blocks = q_groups, 0
    if slots is not None and len(chunks) > 1:
        raise ValueError("sm90_block_sparse_bwd64_split: prebuilt slots need one chunk")
    common = sm100_bwd64_common_stages(out, dout, lse, k2q_num, kv_block_sizes, dk=dk, dv=dv, with_order=False,
                                       zero_dq=False)  # the ds_out build never touches dq_accum
    q2k_i, k2q_i = (t.to(torch.int32).reshape(bh, nb, -1) for t in (q2k_idx, k2q_idx))
    q2k_n, k2q_n = (t.to(torch.int32).reshape(bh, nb) for t in (q2k_num, k2q_num))
    grouped = [group_bounds(k2q_i[h0:h1], k2q_n[h0:h1], nb, group_blocks, min_blocks) for h0, h1 in chunks]
    several = any(gb.shape[1] > 2 for _, gb in grouped)  # each row's entries split by q group
    if slots is not None and several:
        raise ValueError("sm90_block_sparse_bwd64_split: prebuilt slots need one q group (q_groups=None)")
    ticket = max(h1 - h0 for h0, h1 in chunks) * nb * TICKET_ELEMS if several else 0
    ws = torch.empty(ticket + ws_pairs * DS_TILE_ELEMS, dtype=torch.bfloat16, device=q.device)
    main = main_maker.compile("sm_90a")
    dq_kernel = dq_maker.compile("sm_90a")
    vbs = kv_block_sizes.to(torch.int32).contiguous()

    def rows(t, h0, h1):  # a chunk's 2-D row view
        return t.reshape(bh, -1)[h0:h1].reshape(-1, d) if t.dim() == 4 else t.reshape(bh, -1)[h0:h1].reshape(-1)

    for (h0, h1), (kidx, gb) in zip(chunks, grouped):
        items = (h1 - h0) * nb
        qi, qn, kn = q2k_i[h0:h1], q2k_n[h0:h1], k2q_n[h0:h1]
        qoff, slot = chunk_slots(qi, qn, kidx.reshape(h1 - h0, nb, -1), kn, nb) if slots is None else slots
        slot = slot.reshape(-1)
        ds = ws
        if gb.shape[1] > 2:  # the ticket's counters (zeroed) and workspace first (the main kernel's layout)
            slot = torch.cat([torch.zeros(items * TICKET_COUNTERS, dtype=torch.int32, device=q.device), slot])
            ds = ws[items * TICKET_ELEMS:]
        knum = kn.reshape(items).contiguous()
        qidx, qnum = qi.reshape(items, -1).contiguous(), qn.reshape(items).contiguous()
        order = work_order(knum, nb)
        if order is None:
            order = torch.arange(items, dtype=torch.int32, device=q.device)
        with torch.cuda.device(q.device):
            main(rows(q, h0, h1), rows(k, h0, h1), rows(v, h0, h1), rows(dout, h0, h1), rows(dk, h0, h1),
                 rows(dv, h0, h1), rows(common["dq_accum"], h0, h1), rows(common["lse2"], h0, h1),
                 rows(common["delta"], h0, h1), kidx, knum, vbs, order, gb, ws.view(torch.float32)[:4],
                 slot, float(sm_scale))
            dq_kernel(rows(k, h0, h1), ds[:DS_TILE_ELEMS], rows(dq, h0, h1), rows(lse, h0, h1), qidx, qnum,
                      qoff, vbs, float(sm_scale))
    return dq, dk, dv
