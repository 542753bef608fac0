"""Variable-length batches: several videos packed into one sequence, one launch per kernel.

``block_sparse_attn_varlen`` and ``video_sparse_attn_varlen`` take a batch of N sequences of
different lengths (and latent grids) packed along the token axis, ``q [S_q, H, D]`` and
``k, v [S_kv, H, D]`` ("THD", as in flash-attn's varlen API), with token offsets
``cu_seqlens_q`` / ``cu_seqlens_kv`` (integer ``[N + 1]``). Every sequence is already in tile
order and padded to a whole number of blocks (``to_tiles`` of each video, concatenated), so
each offset is a multiple of the block.

Design (exact, no host synchronisation): the batch runs as ONE sequence with B = 1 and a
block-diagonal map. Each block's sequence id comes from the offsets on the device
(``torch.searchsorted``); query block i may attend kv block j only when both belong to the
same sequence, so nothing crosses sequences whatever the caller's map holds there. The
packed call goes through the public ``_bshd`` API, so forward and backward are one launch per
kernel and, on a deterministic route (Triton), every sequence's output, LSE and gradients
equal those of running it alone, bit for bit (the same kv blocks in the same order).

``video_sparse_attn_varlen`` runs the compression branch and the top-k per sequence: coarse
scores of cross-sequence pairs are ``-inf`` (no weight), and each query block keeps the
``min(topk, KVb of its sequence)`` best blocks of its own sequence, chosen exactly as
``topk_block_map`` chooses them for that sequence alone.

Checks: shapes at no cost; the offsets' values (start 0, non-decreasing, block multiples, end
at the packed length) by one device reduction read once per offsets tensor (identity and
version, like the sizes range check), skipped while torch.compile traces. Limits: the map is
materialised for the whole packed batch (``[H, Qb, KVb]`` bool over all sequences), so memory
grows with the square of the total block count; the sparse branch always asks for the LSE, so
the ``sm120`` backend (no LSE) does not serve it.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import api
from .api_indices import checked_once
from .validation import Shapes, check_block_map, check_block_sizes, check_qkv

__all__ = ["block_sparse_attn_varlen", "video_sparse_attn_varlen", "sequence_ids"]

_BSHD_API = {64: api.block_sparse_attn_bshd, 128: api.block_sparse_attn_128_bshd,
             256: api.block_sparse_attn_256_bshd}


# ------------------------------------------------------------------ checks


def _check_thd(q, k, v, block_size: int) -> Shapes:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{name} must be 3-D [total_tokens, H, D] (packed sequences), got shape {list(x.shape)}")
    return check_qkv(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), bshd=True, block_size=block_size)


def _check_cu_seqlens(cu_q, cu_kv, q_len: int, kv_len: int, block_size: int, device: torch.device) -> int:
    """Shape checks now; value checks once per tensor pair. Returns N (number of sequences)."""
    for name, cu in (("cu_seqlens_q", cu_q), ("cu_seqlens_kv", cu_kv)):
        if not isinstance(cu, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be an int32 or int64 tensor, got {cu.dtype}")
        if cu.device != device:
            raise ValueError(f"{name} must be on q's device {device}, got {cu.device}")
        if cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{name} must be 1-D [N + 1] with N >= 1 sequences, got shape {list(cu.shape)}")
    if cu_q.numel() != cu_kv.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_kv must describe the same number of sequences, got "
                         f"{cu_q.numel() - 1} and {cu_kv.numel() - 1}")
    checked_once([cu_q, cu_kv], ("cu_seqlens", q_len, kv_len, block_size),
                 lambda: _check_cu_values(cu_q, cu_kv, q_len, kv_len, block_size))
    return cu_q.numel() - 1


def _cu_flags(cu: Tensor, total: int, block_size: int) -> Tensor:
    c = cu.to(torch.int64)
    return torch.stack([c[0] != 0, (c[1:] < c[:-1]).any(), (c % block_size != 0).any(), c[-1] != total])


def _check_cu_values(cu_q: Tensor, cu_kv: Tensor, q_len: int, kv_len: int, block_size: int) -> None:
    flags = torch.stack([_cu_flags(cu_q, q_len, block_size), _cu_flags(cu_kv, kv_len, block_size)]).tolist()
    what = ("must start at 0", "must be non-decreasing", f"must be multiples of the block size {block_size} "
            "(each sequence a whole number of blocks)", "must end at the packed length")
    for (name, cu, total), row in zip((("cu_seqlens_q", cu_q, q_len), ("cu_seqlens_kv", cu_kv, kv_len)), flags):
        for bad, text in zip(row, what):
            if bad:
                end = f" {total}" if text.endswith("length") else ""
                raise ValueError(f"{name} {text}{end}, got {cu.tolist()}")


def _check_topk(topk, n: int):
    """int -> int; a sequence of N ints -> tuple. Each >= 1."""
    if isinstance(topk, (list, tuple)):
        if len(topk) != n:
            raise ValueError(f"topk must be an int or one int per sequence ({n}), got {len(topk)} values")
        for t in topk:
            if isinstance(t, bool) or not isinstance(t, int) or t < 1:
                raise ValueError(f"topk must hold positive ints, got {list(topk)!r}")
        return tuple(topk)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive int or one positive int per sequence, got {topk!r}")
    return topk


# ------------------------------------------------------------------ packing helpers


def sequence_ids(cu_seqlens: Tensor, num_blocks: int, block_size: int) -> Tensor:
    """Sequence of each of the ``num_blocks`` packed blocks, int64 ``[num_blocks]``, on the
    device (no sync): block i belongs to sequence s iff ``cu[s] <= i * block < cu[s + 1]``."""
    starts = cu_seqlens.to(torch.int64) // block_size
    blocks = torch.arange(num_blocks, device=cu_seqlens.device, dtype=torch.int64)
    return torch.searchsorted(starts, blocks, right=True) - 1


def _same_sequence(cu_q: Tensor, cu_kv: Tensor, qb: int, kvb: int, block_size: int) -> Tuple[Tensor, Tensor]:
    seq_q = sequence_ids(cu_q, qb, block_size)
    seq_kv = sequence_ids(cu_kv, kvb, block_size)
    return seq_q[:, None] == seq_kv[None, :], seq_q  # [Qb, KVb] bool


# ------------------------------------------------------------------ block-sparse


def block_sparse_attn_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_kv: Tensor,
                             block_map: Tensor, variable_block_sizes: Tensor, *,
                             block_size: int = 64) -> Tuple[Tensor, Tensor]:
    """Block-sparse attention over N packed sequences, one launch per kernel.

    ``q [S_q, H, D]``, ``k, v [S_kv, H, D]``; ``cu_seqlens_* [N + 1]`` token offsets (multiples of
    ``block_size``); ``block_map`` bool ``[H, Qb, KVb]`` or ``[1, H, Qb, KVb]`` over the packed
    blocks (entries pairing blocks of different sequences are ignored); ``variable_block_sizes``
    ``[KVb]``, the packed per-block sizes. Returns ``out [S_q, H, D]`` and natural-log fp32
    ``lse [H, S_q]`` (detached; ``-inf`` for rows that see no key).
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size not in _BSHD_API:
        raise ValueError(f"block_size must be 64, 128 or 256, got {block_size!r}")
    shapes = _check_thd(q, k, v, block_size)
    qb, kvb = shapes.q_len // block_size, shapes.kv_len // block_size
    _check_cu_seqlens(cu_seqlens_q, cu_seqlens_kv, shapes.q_len, shapes.kv_len, block_size, q.device)
    block_map = check_block_map(block_map, shapes, block_size, q.device)  # [1, H, Qb, KVb]
    same, _ = _same_sequence(cu_seqlens_q, cu_seqlens_kv, qb, kvb, block_size)
    out, lse = _BSHD_API[block_size](q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), block_map & same,
                                     variable_block_sizes)
    return out.squeeze(0), lse.squeeze(0)


# ------------------------------------------------------------------ VSA


def _block_elements(block_size) -> int:
    if isinstance(block_size, bool):
        raise ValueError(f"block_size must be an int or a tuple of 3 positive ints, got {block_size!r}")
    if isinstance(block_size, int):
        n = block_size
    elif (isinstance(block_size, (tuple, list)) and len(block_size) == 3
          and all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in block_size)):
        n = math.prod(block_size)
    else:
        raise ValueError(f"block_size must be an int or a tuple of 3 positive ints (T, H, W), got {block_size!r}")
    if n not in _BSHD_API:
        raise ValueError(f"block_size must have 64, 128 or 256 elements, got {block_size!r} ({n})")
    return n


def _block_mean_thd(x: Tensor, sizes: Tensor, be: int) -> Tensor:
    """fp32 mean over the valid (leading) tokens of each block of ``x [S, H, D]`` -> ``[H, n, D]``."""
    n = x.shape[0] // be
    valid = torch.arange(be, device=x.device)[None, :] < sizes[:, None]  # [n, be]
    xb = x.reshape(n, be, x.shape[1], x.shape[2])
    total = torch.where(valid.view(n, be, 1, 1), xb, torch.zeros((), dtype=x.dtype, device=x.device)).sum(
        1, dtype=torch.float32)
    return (total / sizes.clamp(min=1).to(torch.float32).view(n, 1, 1)).transpose(0, 1)


_TOPK_CACHE: dict = {}


def _topk_tensor(topk: Tuple[int, ...], device: torch.device) -> Tensor:
    """Per-sequence top-k as an int32 device tensor. A host -> device copy synchronises the
    stream, so each distinct tuple is copied once per device and kept (a few bytes each)."""
    if torch.compiler.is_compiling():
        return torch.tensor(topk, dtype=torch.int32, device=device)
    key = (topk, device)
    hit = _TOPK_CACHE.get(key)
    if hit is None:
        if len(_TOPK_CACHE) >= 256:
            _TOPK_CACHE.clear()
        with torch.inference_mode(False):
            hit = _TOPK_CACHE[key] = torch.tensor(topk, dtype=torch.int32, device=device)
    return hit


def _select_per_sequence(scores: Tensor, same: Tensor, topk_rows) -> Tensor:
    """Per row, the ``topk`` best columns of the row's own sequence (``same``), ordered as a
    stable descending sort orders them (ties to the lowest index, NaN first): exactly what
    ``topk_block_map`` picks for that sequence alone. ``topk_rows`` is an int or int64 ``[Qb, 1]``."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    own = same.expand_as(scores).gather(-1, order)
    rank = torch.cumsum(own, dim=-1, dtype=torch.int32)  # 1-based rank among the row's own columns
    keep = own & (rank <= topk_rows)
    return torch.zeros_like(own).scatter_(-1, order, keep)


def video_sparse_attn_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_kv: Tensor,
                             variable_block_sizes: Tensor, q_variable_block_sizes: Tensor,
                             topk: Union[int, Sequence[int]],
                             block_size: Union[int, Tuple[int, int, int]] = (4, 4, 4),
                             compress_attn_weight: Optional[Tensor] = None) -> Tensor:
    """Video Sparse Attention over N packed sequences (``q [S_q, H, D]``, ``k, v [S_kv, H, D]``,
    every sequence in tile order and padded to whole blocks), per sequence, in one pass.

    ``variable_block_sizes [KVb]`` / ``q_variable_block_sizes [Qb]``: packed per-block sizes.
    ``topk``: one int for every sequence, or one per sequence; each query block keeps
    ``min(topk, KVb of its sequence)`` kv blocks of its own sequence. ``block_size``: the 3-D
    tile or an int block length (64, 128, 256 elements). ``compress_attn_weight``: q's shape
    and dtype. Returns q's shape and dtype.
    """
    be = _block_elements(block_size)
    shapes = _check_thd(q, k, v, be)
    qb, kvb = shapes.q_len // be, shapes.kv_len // be
    n = _check_cu_seqlens(cu_seqlens_q, cu_seqlens_kv, shapes.q_len, shapes.kv_len, be, q.device)
    kv_sizes = check_block_sizes(variable_block_sizes, kvb, be, q.device)
    q_sizes = check_block_sizes(q_variable_block_sizes, qb, be, q.device, name="q_variable_block_sizes")
    topk = _check_topk(topk, n)
    if compress_attn_weight is not None:
        if not isinstance(compress_attn_weight, Tensor) or compress_attn_weight.shape != q.shape:
            shape = getattr(compress_attn_weight, "shape", None)
            raise ValueError(f"compress_attn_weight must be a tensor of q's shape {tuple(q.shape)}, got {shape}")
        if compress_attn_weight.dtype != q.dtype:
            raise TypeError(f"compress_attn_weight must have q's dtype {q.dtype}, got {compress_attn_weight.dtype}")
        if compress_attn_weight.device != q.device:
            raise ValueError(f"compress_attn_weight must be on q's device {q.device}, "
                             f"got {compress_attn_weight.device}")

    same, seq_q = _same_sequence(cu_seqlens_q, cu_seqlens_kv, qb, kvb, be)
    # Compression branch, fp32, per sequence: cross-sequence and empty kv blocks score -inf.
    qc = _block_mean_thd(q, q_sizes, be)
    kc = _block_mean_thd(k, kv_sizes, be)
    vc = _block_mean_thd(v, kv_sizes, be)
    scores = torch.matmul(qc, kc.transpose(-2, -1)) * shapes.head_dim ** -0.5  # [H, Qb, KVb]
    excluded = ~same | (kv_sizes == 0)[None, :]  # [Qb, KVb]
    scores = scores.masked_fill(excluded, float("-inf"))
    dead = excluded.all(dim=-1, keepdim=True)  # rows whose sequence has nothing to attend to: out_c = 0
    probs = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(excluded, 0.0)
    out_c = torch.matmul(probs, vc).to(q.dtype)  # [H, Qb, D]

    if isinstance(topk, tuple):
        topk_rows = _topk_tensor(topk, q.device)[seq_q.clamp(0, n - 1)].unsqueeze(-1)
    else:
        topk_rows = topk
    block_map = _select_per_sequence(scores.detach(), same, topk_rows)
    out_s, _ = _BSHD_API[be](q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), block_map, variable_block_sizes)

    view = (qb, be, shapes.heads, shapes.head_dim)
    out_c_tok = out_c.transpose(0, 1).unsqueeze(1)  # [Qb, 1, H, D]
    out_view = out_s.reshape(view)
    if compress_attn_weight is not None:
        out = out_view + out_c_tok * compress_attn_weight.reshape(view)
    else:
        out = out_view + out_c_tok
    return out.reshape(q.shape)
