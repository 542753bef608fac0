"""FastVideo's ``block_sparse_attn_varlen``: N sequences of real (unpadded) tokens packed along
the token axis, each with its own q2k lists and block sizes, in one launch per kernel.

Signature and semantics as FastVideo's 0.3.5:

- ``q [T_q, H, D]``, ``k, v [T_kv, H, D]``: each sequence's real tokens in tile order, no
  padding; ``cu_seqlens_q`` / ``cu_seqlens_kv``: int32/int64 ``[N + 1]`` offsets of them.
- ``q2k_idx_list[i]`` ``[1, H, Nq_i, W_i]`` (or ``[H, Nq_i, W_i]``): kv block indices local to
  sequence ``i``; ``q2k_num_list[i]`` ``[1, H, Nq_i]`` (or ``[H, Nq_i]``).
- ``variable_block_sizes_list[i]`` ``[Nkv_i]``: real tokens per kv block of sequence ``i``;
  ``q_variable_block_sizes_list[i]`` ``[Nq_i]`` (``None``: every query block full).
- Sequence ``i``'s tokens fill its blocks in order, block ``b`` taking its leading
  ``sizes[b]`` slots. Returns ``out [T_q, H, D]`` for the real query tokens.

Dataflow, all on the device (FastVideo packs on the host: ``.cpu().tolist()`` and a copy per
block):

1. Checks. Shapes and dtypes (free). Block sizes in range (validation.py, cached per tensor).
   Each sequence's token count must equal the sum of its block sizes (FastVideo silently
   truncates otherwise), and the lists' values (counts in ``[0, W_i]``, local indices below
   ``Nkv_i``, no duplicates): one reduction each, remembered per (identity, version) of every
   tensor read (``api_indices.checked_once``), so a batch whose tensors are reused syncs once.
2. Packing metadata, memoised on the same key: packed kv sizes, each real token's slot in the
   block-padded sequence (a cumsum and a ``searchsorted``).
3. q/k/v scattered into one block-padded ``B = 1`` sequence (``index_copy``; backward a
   gather), lists shifted to global kv blocks and concatenated (block-diagonal by
   construction), one call of ``api_indices._lists_to_op`` (BSHD), output gathered back.
"""

from __future__ import annotations

import weakref
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ...api_indices import _lists_to_op, check_index_lists, check_index_values, checked_once, values_unreadable
from ...validation import check_block_sizes, check_qkv
from ._env import call_with_fastvideo_env

__all__ = ["block_sparse_attn_varlen", "BLOCK_SIZE"]

BLOCK_SIZE = 64


# ------------------------------------------------------------------ padding as autograd ops


class _Pad(torch.autograd.Function):
    """Real tokens ``[T, ...]`` -> zero-padded ``[length, ...]`` at ``slots``; backward: a gather."""

    @staticmethod
    def forward(ctx, x, slots, length):  # type: ignore[override]
        ctx.save_for_backward(slots)
        return x.new_zeros((length,) + tuple(x.shape[1:])).index_copy_(0, slots, x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (slots,) = ctx.saved_tensors
        return grad.index_select(0, slots), None, None


class _Unpad(torch.autograd.Function):
    """Padded ``[length, ...]`` -> the rows at ``slots``; backward: a scatter into zeros (no atomics)."""

    @staticmethod
    def forward(ctx, x, slots):  # type: ignore[override]
        ctx.save_for_backward(slots)
        ctx.length = x.shape[0]
        return x.index_select(0, slots)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (slots,) = ctx.saved_tensors
        return _Pad.apply(grad, slots, ctx.length), None


# ------------------------------------------------------------------ memoised packing metadata

_MEMO: Dict[tuple, tuple] = {}


def _memo(tensors: Sequence[Tensor], extra: tuple, build: Callable[[], tuple]) -> tuple:
    """``build()`` once per (identity, version) of ``tensors`` plus ``extra``; rebuilt every time
    while values cannot be read or for inference tensors. Built as normal tensors."""
    if values_unreadable(tensors) or any(t.is_inference() for t in tensors):
        return build()
    key = tuple((id(t), t._version) for t in tensors) + extra
    hit = _MEMO.get(key)
    if hit is None:
        with torch.inference_mode(False), torch.no_grad():
            hit = build()
        _MEMO[key] = hit
        for t in tensors:
            weakref.finalize(t, _MEMO.pop, key, None)
    return hit


def _token_slots(sizes: Tensor, tokens: int, block: int) -> Tensor:
    """Slot of each of ``tokens`` real tokens when block ``b`` takes ``sizes[b]`` of them (int64)."""
    ends = torch.cumsum(sizes.to(torch.int64), 0)
    t = torch.arange(tokens, device=sizes.device, dtype=torch.int64)
    b = torch.searchsorted(ends, t, right=True).clamp(max=max(sizes.numel() - 1, 0))
    return b * block + (t - (ends[b] - sizes[b]))


# ------------------------------------------------------------------ checks


def _check_list(name: str, value, n: Optional[int]) -> List:
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of tensors (one per sequence), got {type(value).__name__}")
    if n is not None and len(value) != n:
        raise ValueError(f"{name} must have one entry per sequence ({n}), got {len(value)}")
    return list(value)


def _check_cu(name: str, cu, n: int, device: torch.device) -> None:
    if not isinstance(cu, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32 or int64 tensor, got {cu.dtype}")
    if cu.device != device:
        raise ValueError(f"{name} must be on q's device {device}, got {cu.device}")
    if list(cu.shape) != [n + 1]:
        raise ValueError(f"{name} must have shape [N + 1] = [{n + 1}] for {n} sequences, got {list(cu.shape)}")


def _check_cu_values(cu_q: Tensor, cu_kv: Tensor, lens_q: Tensor, lens_kv: Tensor, t_q: int, t_kv: int) -> None:
    """``cu`` must be ``[0, cumsum(lens)]`` and end at the packed token count."""
    flags = []
    for cu, lens, total in ((cu_q, lens_q, t_q), (cu_kv, lens_kv, t_kv)):
        want = torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)])
        flags.append(torch.stack([(cu.to(torch.int64) != want).any(), want[-1] != total]))
    flags = torch.stack(flags).tolist()  # the one sync
    for (name, cu, lens, total, what), (bad_cu, bad_total) in zip(
            (("cu_seqlens_q", cu_q, lens_q, t_q, "q_variable_block_sizes_list"),
             ("cu_seqlens_kv", cu_kv, lens_kv, t_kv, "variable_block_sizes_list")), flags):
        if bad_total:
            raise ValueError(f"the sequences' {what} sum to {int(lens.sum())} tokens but the packed tensor holds "
                             f"{total}")
        if bad_cu:
            raise ValueError(f"{name} must be the running sum of each sequence's real tokens (the sum of its "
                             f"{what} entry), {[0] + torch.cumsum(lens, 0).tolist()}, got {cu.tolist()}")


# ------------------------------------------------------------------ the function


def block_sparse_attn_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_kv: Tensor,
                             q2k_idx_list: Sequence[Tensor], q2k_num_list: Sequence[Tensor],
                             variable_block_sizes_list: Sequence[Tensor],
                             q_variable_block_sizes_list: Optional[Sequence[Tensor]] = None,
                             block_size: int = BLOCK_SIZE) -> Tensor:
    """Block-sparse attention over packed variable-length sequences (see the module docstring)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in (64, 128, 256):
        raise ValueError(f"block_size must be 64, 128 or 256, got {block_size!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name} must be 3-D [total_tokens, H, D], got shape {list(x.shape)}")
    check_qkv(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), bshd=True, block_size=1)
    dev, heads, t_q, t_kv = q.device, q.shape[1], q.shape[0], k.shape[0]

    idx_list = _check_list("q2k_idx_list", q2k_idx_list, None)
    n = len(idx_list)
    if n == 0:
        raise ValueError("q2k_idx_list must hold at least one sequence")
    num_list = _check_list("q2k_num_list", q2k_num_list, n)
    kv_sizes = [s for s in _check_list("variable_block_sizes_list", variable_block_sizes_list, n)]
    q_sizes = None if q_variable_block_sizes_list is None else [s for s in _check_list(
        "q_variable_block_sizes_list", q_variable_block_sizes_list, n)]
    _check_cu("cu_seqlens_q", cu_seqlens_q, n, dev)
    _check_cu("cu_seqlens_kv", cu_seqlens_kv, n, dev)

    nq, nkv, widths = [], [], []
    for i in range(n):
        s = kv_sizes[i]
        count = s.shape[0] if isinstance(s, Tensor) and s.dim() == 1 else -1
        check_block_sizes(s, count, block_size, dev, name=f"variable_block_sizes_list[{i}]")
        num = num_list[i]
        if not isinstance(num, Tensor) or num.dim() not in (2, 3):
            raise ValueError(f"q2k_num_list[{i}] must be a [1, H, Nq] or [H, Nq] tensor, got "
                             f"{list(getattr(num, 'shape', [])) or type(num).__name__}")
        nq.append(num.shape[-1])
        nkv.append(count)
        check_index_lists(idx_list[i], num, batch=1, heads=heads, q_blocks=nq[i], kv_blocks=count, device=dev,
                          names=(f"q2k_idx_list[{i}]", f"q2k_num_list[{i}]"), values=False)
        widths.append(idx_list[i].shape[-1])
        if q_sizes is not None:
            check_block_sizes(q_sizes[i], nq[i], block_size, dev, name=f"q_variable_block_sizes_list[{i}]")
    qb, kvb, width = sum(nq), sum(nkv), max(widths)

    # Packed sizes and token slots, memoised on the sizes tensors (and the token counts).
    size_tensors = kv_sizes + (q_sizes or [])

    def build_packing():
        packed_kv = torch.cat([s.to(torch.int32) for s in kv_sizes]) if kvb else torch.zeros(
            0, dtype=torch.int32, device=dev)
        if q_sizes is not None:
            packed_q = torch.cat([s.to(torch.int32) for s in q_sizes])
        else:
            packed_q = torch.full((qb,), block_size, dtype=torch.int32, device=dev)
        # Token count per sequence, on the device (a host -> device copy would synchronise).
        lens_q = torch.stack([s.to(torch.int64).sum() for s in torch.split(packed_q, nq)])
        lens_kv = torch.stack([s.to(torch.int64).sum() for s in kv_sizes])
        return (packed_kv, _token_slots(packed_q, t_q, block_size), _token_slots(packed_kv, t_kv, block_size),
                lens_q, lens_kv)

    packed_kv, slots_q, slots_kv, lens_q, lens_kv = _memo(size_tensors, ("varlen", block_size, t_q, t_kv, tuple(nq)),
                                                          build_packing)
    checked_once([cu_seqlens_q, cu_seqlens_kv] + size_tensors, ("varlen-cu", block_size, t_q, t_kv, tuple(nq)),
                 lambda: _check_cu_values(cu_seqlens_q, cu_seqlens_kv, lens_q, lens_kv, t_q, t_kv))

    # Global lists: local indices shifted by the sequence's first kv block, padded to one width.
    local, glob, nums, limits, off = [], [], [], [], 0
    for i in range(n):
        idx = idx_list[i].reshape(1, heads, nq[i], widths[i]).to(torch.int64)
        idx = F.pad(idx, (0, width - widths[i]), value=-1)
        local.append(idx)
        glob.append(idx + off)
        nums.append(num_list[i].reshape(1, heads, nq[i]))
        limits.append(torch.full((nq[i],), nkv[i], dtype=torch.int64, device=dev))
        off += nkv[i]
    q2k_num = torch.cat(nums, dim=2)
    checked_once(idx_list + num_list, ("varlen-q2k", tuple(nkv)),
                 lambda: check_index_values(torch.cat(local, dim=2), q2k_num, max(kvb, 1), torch.cat(limits),
                                            names=("q2k_idx_list (concatenated)", "q2k_num_list (concatenated)")))
    q2k_idx = torch.cat(glob, dim=2)

    q_pad = _Pad.apply(q, slots_q, qb * block_size).unsqueeze(0)
    k_pad = _Pad.apply(k, slots_kv, kvb * block_size).unsqueeze(0)
    v_pad = _Pad.apply(v, slots_kv, kvb * block_size).unsqueeze(0)
    out_pad, _ = call_with_fastvideo_env(_lists_to_op, q_pad, k_pad, v_pad, q2k_idx, q2k_num, packed_kv,
                                         block_size=block_size, bshd=True, kv_blocks=kvb)
    return _Unpad.apply(out_pad.squeeze(0), slots_q)
