"""FA4 block-sparse metadata from a VSA block map (on the map's device, no host synchronisation):
Q-owned lists for the forward, KV-owned lists for the backward, each split into FULL kv tiles (no
masking) and PARTIAL ones (the ``mask_mod`` decides per element).

A CUDA map takes one fused Triton launch (``kernels/triton/fa4_lists.py``); the torch path
(``_physical_maps`` + ``_index``: about a dozen launches, ~0.3 ms of host time per call on the
H200's host) is the reference it equals bit for bit, and serves CPU maps and machines without
Triton."""

from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import torch

from ..metadata import expand_block_map, map_to_index, split_block_sizes
from .fa4_plan import FA4Plan

__all__ = ["FA4SparseIndex", "FA4Metadata", "build_fwd_metadata", "build_bwd_metadata"]

class FA4SparseIndex(NamedTuple):
    """FA4 block-sparse lists (int32). Forward: rows are q tiles, columns kv tiles.
    Backward: rows are kv tiles, columns q tiles. ``*_idx`` has the selected columns first
    (ascending); entries past ``*_cnt`` are filler FA4 never reads."""

    full_cnt: torch.Tensor
    full_idx: torch.Tensor
    mask_cnt: torch.Tensor
    mask_idx: torch.Tensor
    block_size: Tuple[int, int]  # (q rows per sparse q block, kv tile)


class FA4Metadata(NamedTuple):
    index: FA4SparseIndex
    kv_tile_sizes: torch.Tensor  # int32 [KVb * block_size // kv_tile]: the mask_mod's aux tensor
    plan: FA4Plan


def _physical_maps(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan, all_full: bool = False):
    """(full map, partial map or None, tile sizes). ``all_full`` is the caller's promise that every
    kv block is full (known from a cached range check): then the partial map is empty and skipped."""
    block = plan.block_size
    kv_factor = block // plan.kv_tile
    q_factor = block // plan.q_sparse
    tile_sizes = split_block_sizes(kv_block_sizes.to(block_map.device), kv_factor, plan.kv_tile)
    # Sizes outside [0, block] mean "none" / "all" valid, as in the reference; clamp per tile.
    tile_sizes = tile_sizes.clamp(0, plan.kv_tile).to(torch.int32).contiguous()
    phys = expand_block_map(block_map.to(torch.bool), q_factor, kv_factor)
    if all_full:
        return phys, None, tile_sizes
    full_cols = (tile_sizes == plan.kv_tile).view(1, 1, 1, -1)
    part_cols = ((tile_sizes > 0) & (tile_sizes < plan.kv_tile)).view(1, 1, 1, -1)
    return phys & full_cols, phys & part_cols, tile_sizes


def _index(full: torch.Tensor, part: Optional[torch.Tensor], block_size: Tuple[int, int]) -> FA4SparseIndex:
    full_idx, full_cnt = map_to_index(full.contiguous())
    if part is None:  # no partial tile anywhere: empty mask lists, no second sort
        mask_idx, mask_cnt = torch.zeros_like(full_idx), torch.zeros_like(full_cnt)
    else:
        mask_idx, mask_cnt = map_to_index(part.contiguous())
    return FA4SparseIndex(full_cnt.contiguous(), full_idx.contiguous(), mask_cnt.contiguous(),
                          mask_idx.contiguous(), block_size)


def _fused(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan, all_full: bool,
           transpose: bool) -> Optional[FA4Metadata]:
    """The lists from one Triton launch (None where the torch path must serve: a CPU map, no
    Triton, a row wider than the kernel's block)."""
    if not block_map.is_cuda or _fa4_lists() is None:
        return None
    return fused_lists(block_map, kv_block_sizes, plan, all_full, transpose)


def fused_lists(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan, all_full: bool,
                transpose: bool) -> Optional[FA4Metadata]:
    """:func:`_fused` without the device test (CPU tensors run it under ``TRITON_INTERPRET=1``:
    the tests compare it with the torch path); None for a row wider than the kernel's block."""
    launch, max_cols = _fa4_lists()
    kv_factor, q_factor = plan.block_size // plan.kv_tile, plan.block_size // plan.q_sparse
    b, h, qb, kvb = block_map.shape
    rows, cols = (kvb * kv_factor, qb * q_factor) if transpose else (qb * q_factor, kvb * kv_factor)
    if cols > max_cols or cols == 0:
        return None
    dev = block_map.device
    m = block_map.view(torch.uint8) if block_map.dtype == torch.bool else block_map
    sizes = kv_block_sizes.to(device=dev, dtype=torch.int32).contiguous()
    tile_sizes = torch.empty(kvb * kv_factor, dtype=torch.int32, device=dev)
    f_idx, m_idx = (torch.empty((b, h, rows, cols), dtype=torch.int32, device=dev) for _ in range(2))
    f_cnt, m_cnt = (torch.empty((b, h, rows), dtype=torch.int32, device=dev) for _ in range(2))
    args = dict(q_factor=q_factor, kv_factor=kv_factor, kv_tile=plan.kv_tile, transpose=transpose, all_full=all_full)
    if m.is_cuda:
        with torch.cuda.device(dev):  # Triton launches on the current device
            launch(m, sizes, tile_sizes, f_idx, f_cnt, m_idx, m_cnt, **args)
    else:
        launch(m, sizes, tile_sizes, f_idx, f_cnt, m_idx, m_cnt, **args)
    index = FA4SparseIndex(f_cnt, f_idx, m_cnt, m_idx, (plan.q_sparse, plan.kv_tile))
    return FA4Metadata(index, tile_sizes, plan)


_FA4_LISTS = None  # (fa4_lists_launch, MAX_COLS) once imported; False without Triton


def _fa4_lists():
    global _FA4_LISTS
    if _FA4_LISTS is None:
        try:
            from ..kernels.triton.fa4_lists import MAX_COLS, fa4_lists_launch
            _FA4_LISTS = (fa4_lists_launch, MAX_COLS)
        except ImportError:
            _FA4_LISTS = False
    return _FA4_LISTS or None


def build_fwd_metadata(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan,
                       all_full: bool = False) -> FA4Metadata:
    """Q-owned forward lists: per sparse q block, its FULL and PARTIAL kv tiles (size-0 dropped)."""
    fused = _fused(_as_4d(block_map), kv_block_sizes, plan, all_full, transpose=False)
    if fused is not None:
        return fused
    full, part, tile_sizes = _physical_maps(_as_4d(block_map), kv_block_sizes, plan, all_full)
    return FA4Metadata(_index(full, part, (plan.q_sparse, plan.kv_tile)), tile_sizes, plan)


def build_bwd_metadata(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan,
                       all_full: bool = False) -> FA4Metadata:
    """KV-owned backward lists: per kv tile, the sparse q blocks that selected it (the transpose)."""
    fused = _fused(_as_4d(block_map), kv_block_sizes, plan, all_full, transpose=True)
    if fused is not None:
        return fused
    full, part, tile_sizes = _physical_maps(_as_4d(block_map), kv_block_sizes, plan, all_full)
    index = _index(full.transpose(-2, -1), None if part is None else part.transpose(-2, -1),
                   (plan.q_sparse, plan.kv_tile))
    return FA4Metadata(index, tile_sizes, plan)


def _as_4d(block_map: torch.Tensor) -> torch.Tensor:
    return block_map.unsqueeze(0) if block_map.dim() == 3 else block_map
