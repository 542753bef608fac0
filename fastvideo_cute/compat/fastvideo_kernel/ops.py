"""FastVideo's ``ops`` module, VSA part: ``video_sparse_attn`` (``[B, H, S, D]``) and
``video_sparse_attn_bshd`` (``[B, S, H, D]``), same signatures.

FastVideo's ``block_size``: an int ``n`` is the cube ``(n, n, n)`` (4 -> 64 elements), a tuple
the tile; the default here is ``VSA_TILE_SIZE = (4, 4, 4)`` (FastVideo's default int 64 would be
a 64^3 cube, which no kernel serves). 64, 128 and 256 elements are served in both layouts
(FastVideo's ``_bshd`` refuses 64). The work is ``fastvideo_cute.video_sparse_attn[_bshd]``
(compression in fp32, padding tokens excluded from the means: docs/compat.md lists how that
differs from FastVideo's) with FastVideo's route variables translated (``_env``).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

from torch import Tensor

from ... import api
from ._common import as_topk, tile_elements
from ._env import call_with_fastvideo_env

__all__ = ["video_sparse_attn", "video_sparse_attn_bshd"]

_TILE = (4, 4, 4)


def video_sparse_attn(q: Tensor, k: Tensor, v: Tensor, variable_block_sizes: Tensor, q_variable_block_sizes: Tensor,
                      topk: int, block_size: Union[int, Tuple[int, int, int]] = _TILE,
                      compress_attn_weight: Optional[Tensor] = None) -> Tensor:
    """VSA for ``[B, H, S, D]`` tensors in tile order; returns ``out_c * gate + out_s``."""
    tile, _ = tile_elements(block_size)
    return call_with_fastvideo_env(api.video_sparse_attn, q, k, v, variable_block_sizes,
                                   q_variable_block_sizes, as_topk(topk), tile, compress_attn_weight)


def video_sparse_attn_bshd(q: Tensor, k: Tensor, v: Tensor, variable_block_sizes: Tensor,
                           q_variable_block_sizes: Tensor, topk: int,
                           block_size: Union[int, Tuple[int, int, int]] = _TILE,
                           compress_attn_weight: Optional[Tensor] = None) -> Tensor:
    """VSA for ``[B, S, H, D]`` tensors in tile order."""
    tile, _ = tile_elements(block_size)
    return call_with_fastvideo_env(api.video_sparse_attn_bshd, q, k, v, variable_block_sizes,
                                   q_variable_block_sizes, as_topk(topk), tile, compress_attn_weight)
