"""FastVideo's ``block_sparse_attn_256`` module: ``block_sparse_attn_128`` / ``_256`` and their
``_bshd`` twins (logical 128 / 256-token blocks), returning ``(out, lse)``.

Same parameter names as FastVideo's. They call ``fastvideo_cute.block_sparse_attn_128`` /
``_256`` (``_bshd``) with FastVideo's route variables translated (``_env``); a non-bool map is
read as ``!= 0``. ``lse`` is natural-log fp32 ``[B, H, S_q]`` (``lse_format="log2"``: log2 form).
"""

from __future__ import annotations

from typing import Tuple

from torch import Tensor

from ... import api
from ._common import check_lse_format, convert_lse, map_as_bool
from ._env import call_with_fastvideo_env

__all__ = ["block_sparse_attn_128", "block_sparse_attn_128_bshd", "block_sparse_attn_256",
           "block_sparse_attn_256_bshd"]


def _run(fn, q, k, v, block_map, sizes, lse_format):
    check_lse_format(lse_format)
    out, lse = call_with_fastvideo_env(fn, q, k, v, map_as_bool(block_map), sizes)
    return out, convert_lse(lse, lse_format)


def block_sparse_attn_128(q: Tensor, k: Tensor, v: Tensor, logical_block_map_128: Tensor,
                          logical_variable_block_sizes_128: Tensor, *, lse_format: str = "ln") -> Tuple[Tensor, Tensor]:
    """128-token blocks, ``[B, H, S, D]``."""
    return _run(api.block_sparse_attn_128, q, k, v, logical_block_map_128, logical_variable_block_sizes_128,
                lse_format)


def block_sparse_attn_128_bshd(q: Tensor, k: Tensor, v: Tensor, logical_block_map_128: Tensor,
                               logical_variable_block_sizes_128: Tensor, *,
                               lse_format: str = "ln") -> Tuple[Tensor, Tensor]:
    """128-token blocks, ``[B, S, H, D]`` (``lse`` stays ``[B, H, S]``)."""
    return _run(api.block_sparse_attn_128_bshd, q, k, v, logical_block_map_128, logical_variable_block_sizes_128,
                lse_format)


def block_sparse_attn_256(q: Tensor, k: Tensor, v: Tensor, logical_block_map_256: Tensor,
                          logical_variable_block_sizes_256: Tensor, *, lse_format: str = "ln") -> Tuple[Tensor, Tensor]:
    """256-token blocks, ``[B, H, S, D]``."""
    return _run(api.block_sparse_attn_256, q, k, v, logical_block_map_256, logical_variable_block_sizes_256,
                lse_format)


def block_sparse_attn_256_bshd(q: Tensor, k: Tensor, v: Tensor, logical_block_map_256: Tensor,
                               logical_variable_block_sizes_256: Tensor, *,
                               lse_format: str = "ln") -> Tuple[Tensor, Tensor]:
    """256-token blocks, ``[B, S, H, D]`` (``lse`` stays ``[B, H, S]``)."""
    return _run(api.block_sparse_attn_256_bshd, q, k, v, logical_block_map_256, logical_variable_block_sizes_256,
                lse_format)
