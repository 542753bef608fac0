"""FastVideo's ``vsa_utils``: tile-partition indices, per-tile sizes and the metadata bundle.

Same names, signatures, values, dtypes and caching as FastVideo's 0.3.5 helpers (a latent grid
``(T, H, W)`` in raster order; tiles ordered raster over the tile grid, each tile's tokens
raster over its actual extent: the layout of ``fastvideo_cute.tiling``, from which these are
built):

- ``get_tile_partition_indices(shape, tile, device)`` -> int64 ``[T*H*W]``: raster token at each
  position of the unpadded tile order (``x_tiled = x[..., idx, ...]``).
- ``get_reverse_tile_partition_indices(...)`` -> its inverse permutation (``argsort``).
- ``construct_variable_block_sizes(shape, num_tiles, device, tile)`` -> int32 ``[n_tiles]``.
- ``get_non_pad_index(sizes, max_block_size)`` -> int64 positions of the real tokens in the
  block-padded layout (block ``b`` owns slots ``[b * max_block_size, (b + 1) * max_block_size)``).
- ``build_vsa_metadata(shape, tile, device)`` -> the dict FastVideo returns.

The three shape-keyed getters are ``lru_cache``-d (10 entries, as FastVideo's) and return the
cached tensor itself, so repeated calls hand back the same object (callers must not modify it);
``device`` is canonicalised first (``"cuda"`` -> the current CUDA device) and list shapes are
accepted. Differences (docs/compat.md): tensors are built as normal tensors even under
``torch.inference_mode``, and a ``num_tiles`` that is not ``ceil(shape / tile)`` is a
``ValueError`` (FastVideo returns sizes that describe no tiling).
"""

from __future__ import annotations

import functools
import math
from typing import Sequence, Tuple, Union

import torch

from ...tiling import tile_counts, tile_scatter_index, variable_block_sizes

__all__ = [
    "VSA_TILE_SIZE",
    "get_tile_partition_indices",
    "get_reverse_tile_partition_indices",
    "construct_variable_block_sizes",
    "get_non_pad_index",
    "build_vsa_metadata",
]

VSA_TILE_SIZE = (4, 4, 4)
_SUPPORTED_VSA_BLOCK_VOLUMES = (64, 128, 256)
_CACHE = 10


def _canonicalize_device(device: Union[torch.device, str]) -> torch.device:
    """``"cuda"`` without an index -> the current CUDA device (a stable cache key)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _shape3(value: Sequence[int], name: str) -> Tuple[int, int, int]:
    try:
        out = tuple(int(x) for x in value)
    except TypeError:
        raise ValueError(f"{name} must be 3 positive ints, got {value!r}") from None
    if len(out) != 3 or min(out) < 1:
        raise ValueError(f"{name} must be 3 positive ints, got {value!r}")
    return out


@functools.lru_cache(maxsize=_CACHE)
def _partition(shape, tile, device) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        # Slots are increasing in tile order, so sorting tokens by slot gives the tile order.
        return torch.argsort(tile_scatter_index(shape, tile, device), stable=True)


@functools.lru_cache(maxsize=_CACHE)
def _reverse(shape, tile, device) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        return torch.argsort(_partition(shape, tile, device), stable=True)


@functools.lru_cache(maxsize=_CACHE)
def _sizes(shape, tile, device) -> torch.Tensor:
    with torch.inference_mode(False), torch.no_grad():
        return variable_block_sizes(shape, tile, device)


def get_tile_partition_indices(dit_seq_shape: Tuple[int, int, int], tile_size: Tuple[int, int, int],
                               device: Union[torch.device, str]) -> torch.Tensor:
    """Raster -> tile order: ``x[..., idx, ...]`` puts each tile's tokens together (no padding)."""
    return _partition(_shape3(dit_seq_shape, "dit_seq_shape"), _shape3(tile_size, "tile_size"),
                      _canonicalize_device(device))


def get_reverse_tile_partition_indices(dit_seq_shape: Tuple[int, int, int], tile_size: Tuple[int, int, int],
                                       device: Union[torch.device, str]) -> torch.Tensor:
    """Inverse of :func:`get_tile_partition_indices`: tile order back to raster."""
    return _reverse(_shape3(dit_seq_shape, "dit_seq_shape"), _shape3(tile_size, "tile_size"),
                    _canonicalize_device(device))


def construct_variable_block_sizes(dit_seq_shape: Tuple[int, int, int], num_tiles: Tuple[int, int, int],
                                   device: Union[torch.device, str],
                                   tile_size: Tuple[int, int, int] = VSA_TILE_SIZE) -> torch.Tensor:
    """Real tokens per tile, int32 ``[prod(num_tiles)]`` (edge tiles may be partial)."""
    shape, tile = _shape3(dit_seq_shape, "dit_seq_shape"), _shape3(tile_size, "tile_size")
    tiles = _shape3(num_tiles, "num_tiles")
    if tiles != tile_counts(shape, tile):
        raise ValueError(f"num_tiles must be ceil(dit_seq_shape / tile_size) = {tile_counts(shape, tile)} for "
                         f"dit_seq_shape={shape}, tile_size={tile}, got {tiles}")
    return _sizes(shape, tile, _canonicalize_device(device))


def get_non_pad_index(variable_block_sizes: torch.Tensor, max_block_size: int) -> torch.Tensor:
    """int64 positions of the real tokens when block ``b`` owns ``max_block_size`` slots and
    its ``variable_block_sizes[b]`` real tokens come first. Its length is data-dependent, so on
    a GPU this reads the sizes back (a sync), as FastVideo's does."""
    n = variable_block_sizes.shape[0]
    dev = variable_block_sizes.device
    slot = torch.arange(max_block_size, device=dev)
    index = torch.arange(n, device=dev)[:, None] * max_block_size + slot[None, :]
    return index[slot[None, :] < variable_block_sizes[:, None]]


def build_vsa_metadata(dit_seq_shape: Tuple[int, int, int], tile_size: Tuple[int, int, int] = VSA_TILE_SIZE,
                       device: Union[torch.device, str] = "cuda") -> dict:
    """Every VSA index for a latent grid: the keys FastVideo returns (tile_partition_indices,
    reverse_tile_partition_indices, variable_block_sizes, non_pad_index, num_tiles,
    max_block_size). The tile volume must be 64, 128 or 256."""
    device = _canonicalize_device(device)
    shape, tile = _shape3(dit_seq_shape, "dit_seq_shape"), _shape3(tile_size, "tile_size")
    max_block_size = math.prod(tile)
    if max_block_size not in _SUPPORTED_VSA_BLOCK_VOLUMES:
        raise ValueError(f"tile_size {tile} holds {max_block_size} tokens; a VSA tile must hold one of "
                         f"{_SUPPORTED_VSA_BLOCK_VOLUMES}")
    num_tiles = tile_counts(shape, tile)
    sizes = construct_variable_block_sizes(shape, num_tiles, device, tile)
    return {
        "tile_partition_indices": get_tile_partition_indices(shape, tile, device),
        "reverse_tile_partition_indices": get_reverse_tile_partition_indices(shape, tile, device),
        "variable_block_sizes": sizes,
        "non_pad_index": get_non_pad_index(sizes, max_block_size),
        "num_tiles": num_tiles,
        "max_block_size": max_block_size,
    }
