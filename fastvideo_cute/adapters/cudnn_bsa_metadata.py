"""The library's logical q2k lists -> cuDNN BSA's sparse metadata, and its LSE -> the library's.

Input (the library's, from ``fastvideo_cute.metadata.map_to_index(block_map)``): ``q2k_idx``
int32 ``[B, H, Qb, W]`` (the first ``q2k_num[b, h, i]`` entries are the selected kv blocks,
ascending; the rest are the unselected ids, ascending), ``q2k_num`` int32 ``[B, H, Qb]``,
``kv_block_sizes`` int ``[KVb]`` (valid leading tokens per logical kv block).

Output (:class:`CudnnBlockSparseMeta`, what ``block_sparse_attention_forward/_backward`` of
``nvidia-cudnn-frontend==1.32.0`` take as ``q2k_block_index``, ``q2k_block_nums``,
``block_sizes`` and ``sparse_block_size``):

- ``q2k_block_index`` int32 ``[B, H, Qb_phys, W_phys]``, contiguous. cuDNN reads only the first
  ``q2k_block_nums`` entries of a row: the SM90 kernels walk ``[0, num)`` (blk64 from the end:
  "the inactive suffix is never read"), the SM100/SM110 kernels round an odd count up to even
  and clamp the extra (phantom) slot's index to ``num - 1`` with a size-0 mask, and the backward's
  k2q CSR builder (``bucketed_k2q_csr.py``) counts ``slot < num`` only (and skips ids outside
  ``[0, KVb)``). The capacity ``W`` must be >= 1, and it is a compile-time constant of the CSR
  builder (``edge_width``), so it is kept at ``KVb`` (one compile per kv length). Ids must be
  unique within a row (a duplicate would be attended twice: cuDNN does not deduplicate); order
  is free for cuDNN (the forward walks the list backwards, the CSR scatters with atomics), and
  ours stay ascending. The filler past ``num`` is the unselected ids, valid and unique, so even
  a reader that ignored ``num`` could not go out of range.
- ``q2k_block_nums`` int32 ``[B, H, Qb_phys]``. A row may be 0 (or select only size-0 blocks):
  cuDNN then needs ``allow_empty_block_nums=True`` (SM90: the empty-safe finalizer writes O = 0
  and LSE = -inf instead of ``0 * rcp(0) = NaN``; SM100/SM110: a 0 count skips the tile instead
  of walking slot -1). The adapter passes it unless the caller promises non-empty rows.
- ``block_sizes`` int32 ``[KVb_phys]`` (rank 1: the one rank every cuDNN kernel accepts), or
  ``None`` when every kv block is full (cuDNN then compiles the variant without any masking).
- ``sparse_block`` 64 or 128 (:data:`CUDNN_PHYSICAL_TILE`). Logical 256 runs as 128: query
  block i becomes physical blocks 2i and 2i+1, both with the list
  ``[2j, 2j+1 for j in row i]`` (still ascending and unique), ``num`` doubles, and a size s
  splits into ``[min(s, 128), clamp(s - 128, 0, 128)]`` (valid tokens stay leading). Done with
  on-device torch ops: no host sync, no ``.item()``.

LSE: every cuDNN kernel writes the natural-log LSE, fp32, ``[B, H, S_q]`` contiguous whatever the
layout (SM90 blk64/blk128 ``max * scale * log2(e) * ln 2 + ln(sum)``; SM100 and SM120
``(max * scale * log2(e) + log2(sum)) * ln 2``), and ``-inf`` for a row with no valid key, whose
O is 0 (empty-safe finalizers). That is the library's contract as is, so
:func:`cudnn_lse_to_contract` only checks it. Known difference: cuDNN's SM120 finalizer treats a
NaN row sum like 0 (``is_zero_or_nan``), so a NaN in a visible row gives LSE ``-inf`` there, not
NaN (its O is still NaN).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..metadata import split_block_sizes
from .cudnn_bsa_support import CUDNN_PHYSICAL_TILE

__all__ = [
    "CudnnBlockSparseMeta",
    "build_cudnn_metadata",
    "expand_q2k_lists",
    "drop_empty_blocks",
    "cudnn_lse_to_contract",
]


class CudnnBlockSparseMeta(NamedTuple):
    """cuDNN BSA's sparse metadata for one call (see the module docstring)."""

    sparse_block: int
    q2k_block_index: torch.Tensor
    q2k_block_nums: torch.Tensor
    block_sizes: Optional[torch.Tensor]


def expand_q2k_lists(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, factor: int):
    """Logical q2k lists -> lists over physical blocks ``factor`` times smaller (both axes).

    Physical q block ``factor * i + r`` (``r < factor``) gets row i's list with each logical kv
    id ``j`` replaced by ``factor * j + t`` for ``t < factor`` (in that order), so the list stays
    ascending and unique and its filler stays the unselected ids; ``num`` is multiplied by
    ``factor``. Returns contiguous int32 ``([..., Qb * f, W * f], [..., Qb * f])``.
    """
    if factor == 1:
        return q2k_idx.to(torch.int32).contiguous(), q2k_num.to(torch.int32).contiguous()
    idx = q2k_idx.to(torch.int32)
    sub = torch.arange(factor, dtype=torch.int32, device=idx.device)
    kv = (idx.unsqueeze(-1) * factor + sub).flatten(-2)  # [..., Qb, W * f]
    lead, qb, width = kv.shape[:-2], kv.shape[-2], kv.shape[-1]
    phys_idx = kv.unsqueeze(-2).expand(*lead, qb, factor, width).reshape(*lead, qb * factor, width)
    num = q2k_num.to(torch.int32) * factor
    phys_num = num.unsqueeze(-1).expand(*num.shape, factor).reshape(*num.shape[:-1], num.shape[-1] * factor)
    return phys_idx.contiguous(), phys_num.contiguous()


def drop_empty_blocks(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, block_sizes: torch.Tensor):
    """The lists without the kv blocks of size 0 (they hold no key, so dropping them changes no
    result): each row keeps its other selected ids first, in order, and the filler past the new
    ``num`` is still made of valid, unique ids. cuDNN masks a size-0 block to P = 0 anyway; the
    drop keeps its kernels from loading tiles that hold no key and makes "a row with no valid key"
    the same as "an empty list" (its empty-row path). (An earlier note here blamed size-0 blocks
    for a wrong dV measured on the H200; that was the test metric, see docs/backends/cudnn.md.)
    On-device torch ops, no host sync."""
    width = q2k_idx.shape[-1]
    slots = torch.arange(width, device=q2k_idx.device, dtype=torch.int32)
    keep = (slots < q2k_num.unsqueeze(-1)) & (block_sizes[q2k_idx.long()] > 0)
    csum = torch.cumsum(keep, dim=-1, dtype=torch.int32)
    num = csum[..., -1]
    slot = torch.where(keep, csum - 1, num.unsqueeze(-1) + slots - csum)
    idx = torch.empty_like(q2k_idx, dtype=torch.int32)
    idx.scatter_(-1, slot.long(), q2k_idx.to(torch.int32))
    return idx, num.contiguous()


def _check_int_tensor(name: str, t, dims: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (int32), got {t.dtype}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {dims}-D, got shape {tuple(t.shape)}")


def build_cudnn_metadata(q2k_idx: torch.Tensor, q2k_num: torch.Tensor, kv_block_sizes: torch.Tensor, *,
                         block_size: int, batch: int, heads: int, q_len: int, kv_len: int,
                         all_full: bool, smallest: Optional[int] = None) -> CudnnBlockSparseMeta:
    """The cuDNN metadata for a call with logical ``block_size`` (64, 128 or 256).

    The logical inputs are assumed validated (the library's checks run first); this checks the
    shapes, dtypes and device of what it is given and of what it builds. ``all_full``: the
    caller's (checked) knowledge that every kv block is full; ``block_sizes`` is then None.
    ``smallest``: the smallest logical size when known (the range check's record); when no
    physical block can be empty the size-0 drop (:func:`drop_empty_blocks`, several small
    launches) is skipped.
    """
    if block_size not in CUDNN_PHYSICAL_TILE:
        raise ValueError(f"block_size must be one of {tuple(CUDNN_PHYSICAL_TILE)}, got {block_size}")
    if q_len % block_size or kv_len % block_size:
        raise ValueError(f"q_len {q_len} and kv_len {kv_len} must be multiples of block_size={block_size}")
    qb, kvb = q_len // block_size, kv_len // block_size
    _check_int_tensor("q2k_idx", q2k_idx, 4)
    _check_int_tensor("q2k_num", q2k_num, 3)
    _check_int_tensor("kv_block_sizes", kv_block_sizes, 1)
    if tuple(q2k_idx.shape[:3]) != (batch, heads, qb) or q2k_idx.shape[3] < 1:
        raise ValueError(f"q2k_idx must be [B={batch}, H={heads}, Qb={qb}, W>=1], got {tuple(q2k_idx.shape)}")
    if tuple(q2k_num.shape) != (batch, heads, qb):
        raise ValueError(f"q2k_num must be [B={batch}, H={heads}, Qb={qb}], got {tuple(q2k_num.shape)}")
    if kv_block_sizes.numel() != kvb:
        raise ValueError(f"kv_block_sizes must have KVb={kvb} entries, got {kv_block_sizes.numel()}")
    dev = q2k_idx.device
    for name, t in (("q2k_num", q2k_num), ("kv_block_sizes", kv_block_sizes)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, q2k_idx on {dev}")

    tile = CUDNN_PHYSICAL_TILE[block_size]
    factor = block_size // tile
    idx, num = expand_q2k_lists(q2k_idx, q2k_num, factor)
    sizes = None if all_full else split_block_sizes(kv_block_sizes, factor, tile)
    if sizes is not None and (smallest is None or smallest == 0 or (factor > 1 and smallest <= tile)):
        idx, num = drop_empty_blocks(idx, num, sizes)
    meta = CudnnBlockSparseMeta(tile, idx, num, sizes)
    _check_built(meta, batch, heads, q_len // tile, kv_len // tile, q2k_idx.shape[3] * factor)
    return meta


def _check_built(meta: CudnnBlockSparseMeta, batch: int, heads: int, qb: int, kvb: int, width: int) -> None:
    """What cuDNN's ``_validate_sparse_metadata`` would reject, raised before any launch."""
    idx, num, sizes = meta.q2k_block_index, meta.q2k_block_nums, meta.block_sizes
    if idx.dtype != torch.int32 or tuple(idx.shape) != (batch, heads, qb, width) or not idx.is_contiguous():
        raise ValueError(f"built q2k_block_index must be contiguous int32 {(batch, heads, qb, width)}, "
                         f"got {idx.dtype} {tuple(idx.shape)}")
    if num.dtype != torch.int32 or tuple(num.shape) != (batch, heads, qb) or not num.is_contiguous():
        raise ValueError(f"built q2k_block_nums must be contiguous int32 {(batch, heads, qb)}, got {num.dtype} "
                         f"{tuple(num.shape)}")
    if sizes is not None and (sizes.dtype != torch.int32 or tuple(sizes.shape) != (kvb,) or not sizes.is_contiguous()):
        raise ValueError(f"built block_sizes must be contiguous int32 ({kvb},), got {sizes.dtype} {tuple(sizes.shape)}")


def cudnn_lse_to_contract(lse: torch.Tensor, batch: int, heads: int, q_len: int) -> torch.Tensor:
    """cuDNN's LSE -> the library's: already natural log, fp32 ``[B, H, S_q]``, ``-inf`` for rows
    with no valid key (see the module docstring), so this checks it and returns it unchanged
    (made contiguous if some future path returned a strided view)."""
    if not isinstance(lse, torch.Tensor):
        raise TypeError(f"cuDNN returned an lse of type {type(lse).__name__}, expected a tensor")
    if lse.dtype != torch.float32 or tuple(lse.shape) != (batch, heads, q_len):
        raise RuntimeError(f"cuDNN returned lse {lse.dtype} {tuple(lse.shape)}; the library's contract is float32 "
                           f"[B={batch}, H={heads}, S_q={q_len}]")
    return lse.contiguous()
