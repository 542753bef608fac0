"""Public API (FastVideo-compatible names and signatures).

Block-sparse attention: ``block_sparse_attn`` (64-token blocks), ``block_sparse_attn_128``,
``block_sparse_attn_256`` and their ``_bshd`` twins, each returning ``(out, lse)`` with ``lse``
natural-log fp32 ``[B, H, S_q]`` (see docs/semantics.md). VSA: ``video_sparse_attn`` and
``video_sparse_attn_bshd`` (compression branch + top-k selection + sparse branch + gate).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from .backends.registry import supported_head_dims
from .call import call_info
from .ops import EMPTY_ROUTE, _refuse_forward_ad, block_sparse_attn_op
from .routes import select_vsa_route_name
from .validation import check_block_map, check_block_sizes, check_qkv
from .vsa_autograd import video_sparse_attn_fn

__all__ = [
    "block_sparse_attn",
    "block_sparse_attn_bshd",
    "block_sparse_attn_128",
    "block_sparse_attn_128_bshd",
    "block_sparse_attn_256",
    "block_sparse_attn_256_bshd",
    "video_sparse_attn",
    "video_sparse_attn_bshd",
    "topk_block_map",
]


def _block_sparse(q, k, v, block_map, variable_block_sizes, block_size: int, bshd: bool,
                  q2k: Optional[Tuple[Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor]:
    """``q2k``: checked ascending ``(idx [B, H, Qb, W], num [B, H, Qb])`` int32 lists in place of
    ``block_map`` (None then): the index-native entry points (``api_indices``)."""
    shapes = check_qkv(q, k, v, bshd=bshd, block_size=block_size, head_dims=supported_head_dims())
    if q2k is None:
        block_map = check_block_map(block_map, shapes, block_size, q.device)
    sizes = check_block_sizes(variable_block_sizes, shapes.kv_len // block_size, block_size, q.device)
    return block_sparse_attn_op(q, k, v, block_map, sizes, block_size=block_size, bshd=bshd,
                                sm_scale=shapes.head_dim ** -0.5, q2k=q2k)


def block_sparse_attn(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor,
                      variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 64-token blocks, ``[B, H, S, D]``. Returns ``(out, lse)``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 64, False)


def block_sparse_attn_bshd(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor,
                           variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """:func:`block_sparse_attn` for ``[B, S, H, D]`` tensors (``lse`` stays ``[B, H, S]``)."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 64, True)


def block_sparse_attn_128(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor,
                          variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 128-token blocks, ``[B, H, S, D]``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 128, False)


def block_sparse_attn_128_bshd(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor,
                               variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 128-token blocks, ``[B, S, H, D]``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 128, True)


def block_sparse_attn_256(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor,
                          variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 256-token blocks, ``[B, H, S, D]``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 256, False)


def block_sparse_attn_256_bshd(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor,
                               variable_block_sizes: Tensor) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over 256-token blocks, ``[B, S, H, D]``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 256, True)


def _check_topk(topk) -> int:
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive int, got {topk!r} ({type(topk).__name__})")
    return topk


def topk_block_map(scores: Tensor, topk: int) -> Tensor:
    """Exactly ``min(topk, n)`` True per row of ``scores [..., n]``: the largest, ties to the
    lowest index (a stable descending sort). NaN scores sort first."""
    if not isinstance(scores, Tensor) or scores.dim() < 1 or not scores.dtype.is_floating_point:
        raise TypeError(f"scores must be a floating-point tensor [..., n], got "
                        f"{getattr(scores, 'dtype', type(scores).__name__)}")
    _check_topk(topk)
    n = scores.shape[-1]
    k = min(topk, n)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, order, True)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _block_elements(block_size: Union[int, Sequence[int]]) -> int:
    if _is_int(block_size):
        return block_size
    if not isinstance(block_size, (tuple, list)) or len(block_size) != 3 or \
            not all(_is_int(t) and t > 0 for t in block_size):
        raise ValueError(f"block_size must be an int (64, 128 or 256) or a tuple of 3 positive ints (T, H, W), "
                         f"got {block_size!r} ({type(block_size).__name__})")
    return math.prod(block_size)


def _video_sparse(q, k, v, variable_block_sizes, q_variable_block_sizes, topk, block_size, compress_attn_weight,
                  bshd: bool) -> Tensor:
    block_elements = _block_elements(block_size)
    if block_elements not in (64, 128, 256):
        raise ValueError(f"block_size must have 64, 128 or 256 elements, got {block_size!r} ({block_elements})")
    shapes = check_qkv(q, k, v, bshd=bshd, block_size=block_elements, head_dims=supported_head_dims())
    qb, kvb = shapes.q_len // block_elements, shapes.kv_len // block_elements
    kv_sizes = check_block_sizes(variable_block_sizes, kvb, block_elements, q.device)
    if q_variable_block_sizes is variable_block_sizes and qb == kvb:
        q_sizes = kv_sizes  # one tensor for both (the common self-attention call): checked once
    else:
        q_sizes = check_block_sizes(q_variable_block_sizes, qb, block_elements, q.device,
                                    name="q_variable_block_sizes")
    _check_topk(topk)
    if compress_attn_weight is not None:
        if not isinstance(compress_attn_weight, Tensor):
            raise TypeError(f"compress_attn_weight must be None or a tensor of q's shape {tuple(q.shape)}, "
                            f"got {type(compress_attn_weight).__name__}")
        if compress_attn_weight.shape != q.shape:
            raise ValueError(f"compress_attn_weight must have q's shape {tuple(q.shape)}, "
                             f"got {tuple(compress_attn_weight.shape)}")
        if compress_attn_weight.dtype != q.dtype:
            raise TypeError(f"compress_attn_weight must have q's dtype {q.dtype}, got {compress_attn_weight.dtype}")
        if compress_attn_weight.device != q.device:
            raise ValueError(f"compress_attn_weight must be on q's device {q.device}, got {compress_attn_weight.device}")
    if q.device.type != "meta" and not torch.compiler.is_compiling():
        _refuse_forward_ad(q, k, v, *(() if compress_attn_weight is None else (compress_attn_weight,)))

    sm_scale = shapes.head_dim ** -0.5
    # Compression branch (fp32 block means over the valid tokens, coarse attention over blocks with
    # empty kv blocks excluded), the top-k selection straight to q2k lists, the sparse branch on the
    # selected blocks (its LSE is discarded) and out = out_s + gate * out_c, as one autograd
    # function whose backward adds the compression's gradient into the sparse one in place
    # (fastvideo_cute.vsa_autograd; docs/vsa-glue.md).
    tensors = (q, k, v) + (() if compress_attn_weight is None else (compress_attn_weight,))
    need_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    if q.device.type == "meta" or shapes.batch == 0 or shapes.heads == 0:
        route = EMPTY_ROUTE
    else:
        # Gated inference on sm_90 with 64-token blocks: the sm90 forward with the gate fused
        # (routes.select_vsa_routes); everything else as block_sparse_attn routes.
        route = select_vsa_route_name(call_info(q, k, block_elements, need_grad, bshd, False, kv_sizes),
                                      compress_attn_weight is not None)
    return video_sparse_attn_fn(q, k, v, compress_attn_weight, q_sizes, kv_sizes, topk=topk, block=block_elements,
                                bshd=bshd, sm_scale=sm_scale, route=route,
                                range_checked=not torch.compiler.is_compiling(), need_grad=need_grad)


def video_sparse_attn(q: Tensor, k: Tensor, v: Tensor, variable_block_sizes: Tensor, q_variable_block_sizes: Tensor,
                      topk: int, block_size: Union[int, Tuple[int, int, int]] = (4, 4, 4),
                      compress_attn_weight: Optional[Tensor] = None) -> Tensor:
    """Video Sparse Attention for ``[B, H, S, D]`` tensors already in tile order.

    ``block_size`` is the 3-D tile (its product, 64/128/256, is the block length) or an int
    block length. ``variable_block_sizes`` / ``q_variable_block_sizes`` give the valid tokens
    of each kv / q tile. Returns ``out_c * compress_attn_weight + out_s`` (``out_c + out_s``
    without a gate).
    """
    return _video_sparse(q, k, v, variable_block_sizes, q_variable_block_sizes, topk, block_size,
                         compress_attn_weight, bshd=False)


def video_sparse_attn_bshd(q: Tensor, k: Tensor, v: Tensor, variable_block_sizes: Tensor,
                           q_variable_block_sizes: Tensor, topk: int,
                           block_size: Union[int, Tuple[int, int, int]] = (4, 4, 4),
                           compress_attn_weight: Optional[Tensor] = None) -> Tensor:
    """:func:`video_sparse_attn` for ``[B, S, H, D]`` tensors (no layout round trip)."""
    return _video_sparse(q, k, v, variable_block_sizes, q_variable_block_sizes, topk, block_size,
                         compress_attn_weight, bshd=True)
