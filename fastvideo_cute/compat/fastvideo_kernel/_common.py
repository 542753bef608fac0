"""Helpers shared by the compat modules: FastVideo's block-size conventions and LSE forms."""

from __future__ import annotations

import math
import operator
from typing import Tuple, Union

import torch
from torch import Tensor

__all__ = ["LOG2E", "convert_lse", "infer_block", "map_as_bool", "tile_elements", "as_topk"]

LOG2E = 1.4426950408889634  # 1 / ln(2)
_BLOCKS = (64, 128, 256)


def convert_lse(lse: Tensor, lse_format: str) -> Tensor:
    """Our natural-log LSE -> the requested form. ``"log2"`` is FastVideo's Triton ``M``:
    ``log2(sum exp(s))`` = lse / ln 2 (``-inf`` stays ``-inf``)."""
    if lse_format == "ln":
        return lse
    if lse_format == "log2":
        return lse * LOG2E
    raise ValueError(f"lse_format must be 'ln' or 'log2', got {lse_format!r}")


def check_lse_format(lse_format) -> None:
    if lse_format not in ("ln", "log2"):
        raise ValueError(f"lse_format must be 'ln' or 'log2', got {lse_format!r}")


def infer_block(k, variable_block_sizes, seq_dim: int) -> int:
    """FastVideo infers the block from ``S_kv / len(variable_block_sizes)``; 64 when the
    inputs are malformed (the API's own checks then name the problem)."""
    if not (isinstance(k, Tensor) and k.dim() == 4 and isinstance(variable_block_sizes, Tensor)
            and variable_block_sizes.dim() == 1 and variable_block_sizes.numel() > 0):
        return 64
    s, n = k.shape[seq_dim], variable_block_sizes.numel()
    if s % n == 0 and s // n in _BLOCKS:
        return s // n
    raise ValueError(f"variable_block_sizes has {n} entries for {s} kv tokens: S_kv / len(variable_block_sizes) "
                     f"must be a block size, one of {_BLOCKS}")


def map_as_bool(block_map):
    """FastVideo reads a non-bool map as ``!= 0``; anything not a tensor goes to the API's checks."""
    if isinstance(block_map, Tensor) and block_map.dtype != torch.bool:
        return block_map != 0
    return block_map


def tile_elements(block_size: Union[int, Tuple[int, int, int]]) -> Tuple[Tuple[int, int, int], int]:
    """FastVideo's ``block_size``: an int ``n`` is the cube ``(n, n, n)``; a 3-tuple is the tile.
    Returns (tile, elements); elements must be 64, 128 or 256."""
    if isinstance(block_size, int) and not isinstance(block_size, bool):
        tile = (block_size,) * 3
    elif (isinstance(block_size, (tuple, list)) and len(block_size) == 3
          and all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in block_size)):
        tile = tuple(block_size)
    else:
        raise ValueError(f"block_size must be an int (a cube edge) or a tuple of 3 positive ints, got {block_size!r}")
    n = math.prod(tile)
    if n not in _BLOCKS:
        hint = " (an int block_size is a cube edge, as in FastVideo: 4 means (4, 4, 4) = 64)" \
            if isinstance(block_size, int) else ""
        raise ValueError(f"block_size {block_size!r} has {n} elements; VSA needs 64, 128 or 256{hint}")
    return tile, n


def as_topk(topk) -> int:
    """Python int from any integer scalar (FastVideo passes ``int``; numpy ints are accepted)."""
    if isinstance(topk, bool):
        raise ValueError(f"topk must be a positive int, got {topk!r}")
    try:
        return operator.index(topk)
    except TypeError:
        raise ValueError(f"topk must be a positive int, got {topk!r}") from None
