"""FA4 block-sparse metadata from a VSA block map (pure torch, on the map's device, no host
synchronisation): Q-owned lists for the forward, KV-owned lists for the backward, each split
into FULL kv tiles (no masking) and PARTIAL ones (the ``mask_mod`` decides per element)."""

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


def build_fwd_metadata(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan,
                       all_full: bool = False) -> FA4Metadata:
    """Q-owned forward lists: per sparse q block, its FULL and PARTIAL kv tiles (size-0 dropped)."""
    full, part, tile_sizes = _physical_maps(_as_4d(block_map), kv_block_sizes, plan, all_full)
    return FA4Metadata(_index(full, part, (plan.q_sparse, plan.kv_tile)), tile_sizes, plan)


def build_bwd_metadata(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, plan: FA4Plan,
                       all_full: bool = False) -> FA4Metadata:
    """KV-owned backward lists: per kv tile, the sparse q blocks that selected it (the transpose)."""
    full, part, tile_sizes = _physical_maps(_as_4d(block_map), kv_block_sizes, plan, all_full)
    index = _index(full.transpose(-2, -1), None if part is None else part.transpose(-2, -1),
                   (plan.q_sparse, plan.kv_tile))
    return FA4Metadata(index, tile_sizes, plan)


def _as_4d(block_map: torch.Tensor) -> torch.Tensor:
    return block_map.unsqueeze(0) if block_map.dim() == 3 else block_map
