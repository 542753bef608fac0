"""FastVideo's ``block_sparse_attn`` module: ``block_sparse_attn`` (bool map) and
``block_sparse_attn_from_indices`` (q2k lists), ``[B, H, S, D]``, returning ``(out, lse)``.

FastVideo serves 64-token blocks here (its Triton and TK kernels); the block is what
``S_kv / len(variable_block_sizes)`` gives, as FastVideo infers it, and 128 / 256 are served too.
Calls go to ``fastvideo_cute.block_sparse_attn*`` / ``block_sparse_attn*_from_indices`` (the
latter through ``api_indices._lists_to_op``), with FastVideo's route variables translated
(``_env``). ``lse`` is natural-log fp32 ``[B, H, S_q]`` by default; ``lse_format="log2"``
gives FastVideo's Triton ``M`` (log2 form).
"""

from __future__ import annotations

from typing import Tuple

from torch import Tensor

from ... import api, api_indices
from ._common import check_lse_format, convert_lse, infer_block, map_as_bool
from ._env import call_with_fastvideo_env

__all__ = ["block_sparse_attn", "block_sparse_attn_from_indices"]

_MAP = {64: api.block_sparse_attn, 128: api.block_sparse_attn_128, 256: api.block_sparse_attn_256}
_LISTS = {64: api_indices.block_sparse_attn_from_indices, 128: api_indices.block_sparse_attn_128_from_indices,
          256: api_indices.block_sparse_attn_256_from_indices}


def block_sparse_attn(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor, variable_block_sizes: Tensor, *,
                      lse_format: str = "ln") -> Tuple[Tensor, Tensor]:
    """Block-sparse attention from a ``[B, H, Qb, KVb]`` / ``[H, Qb, KVb]`` map (non-bool read as ``!= 0``)."""
    check_lse_format(lse_format)
    fn = _MAP[infer_block(k, variable_block_sizes, 2)]
    out, lse = call_with_fastvideo_env(fn, q, k, v, map_as_bool(block_map), variable_block_sizes)
    return out, convert_lse(lse, lse_format)


def block_sparse_attn_from_indices(q: Tensor, k: Tensor, v: Tensor, q2k_idx: Tensor, q2k_num: Tensor,
                                   variable_block_sizes: Tensor, *, lse_format: str = "ln") -> Tuple[Tensor, Tensor]:
    """Block-sparse attention from q2k lists ``idx [B, H, Qb, W]``, ``num [B, H, Qb]`` (or without B)."""
    check_lse_format(lse_format)
    fn = _LISTS[infer_block(k, variable_block_sizes, 2)]
    out, lse = call_with_fastvideo_env(fn, q, k, v, q2k_idx, q2k_num, variable_block_sizes)
    return out, convert_lse(lse, lse_format)
