"""Public Ulysses (sequence-parallel) VSA and block-sparse attention.

Each rank of ``group`` (``P`` ranks) holds a contiguous slice of the tiled sequence -- rank ``r``
holds tokens ``[r*S/P, (r+1)*S/P)``, whole tiles -- for every head. The call:

1. checks every argument locally (``checks.py``; nothing is communicated before that passes);
2. moves q, k, v (and the gate) to the head sharding with ONE fused all-to-all: rank ``r`` then
   holds all ``S`` tokens for heads ``[r*H/P, (r+1)*H/P)``;
3. calls the single-GPU public function (``fastvideo_cute.api``) on them, so every route serves
   the call exactly as it would on one GPU, and VSA's per-head compression and top-k see the
   whole sequence: each rank computes bit for bit what one GPU computes for those heads;
4. moves the output (and the LSE) back with one all-to-all.

``pipeline.py`` does 2-4 and the backward. With ``P == 1`` (a group of one, or no process group
at all) the call is a zero-copy pass-through to the single-GPU function.

What every rank passes (identical on every rank unless said otherwise):

- q, k, v (, gate): its own slice, ``[B, S/P, H, D]`` (BSHD) or ``[B, H, S/P, D]`` (BHSD);
- ``variable_block_sizes`` / ``q_variable_block_sizes``: the GLOBAL per-tile sizes (one entry per
  tile of the whole sequence), since the tiling is global;
- ``block_map`` (block-sparse functions): over the whole sequence, ``[B, H, Qb, KVb]`` (or
  ``[H, Qb, KVb]``) with every head -- the rank reads only its heads -- or already sliced to its
  heads, ``[B, H/P, Qb, KVb]`` (or ``[H/P, Qb, KVb]``; then it differs per rank);
- ``topk``, ``block_size``, ``group``, ``head_chunks``.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

from torch import Tensor

from .. import api
from .checks import check_gate, check_global_sizes, check_head_chunks, check_local_qkv, local_block_map
from .group import resolve_group
from .pipeline import Plan, chunk_bounds, run

__all__ = [
    "ulysses_video_sparse_attn",
    "ulysses_block_sparse_attn",
    "ulysses_block_sparse_attn_bshd",
    "ulysses_block_sparse_attn_128",
    "ulysses_block_sparse_attn_128_bshd",
    "ulysses_block_sparse_attn_256",
    "ulysses_block_sparse_attn_256_bshd",
]

_LAYOUTS = {"bhsd": False, "bshd": True}
_BLOCK_SPARSE = {(64, False): api.block_sparse_attn, (64, True): api.block_sparse_attn_bshd,
                 (128, False): api.block_sparse_attn_128, (128, True): api.block_sparse_attn_128_bshd,
                 (256, False): api.block_sparse_attn_256, (256, True): api.block_sparse_attn_256_bshd}


def _group_for(q, group):
    if not isinstance(q, Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    return resolve_group(group, q.device)


def ulysses_video_sparse_attn(q: Tensor, k: Tensor, v: Tensor, variable_block_sizes: Tensor,
                              q_variable_block_sizes: Tensor, topk: int,
                              block_size: Union[int, Tuple[int, int, int]] = (4, 4, 4),
                              compress_attn_weight: Optional[Tensor] = None, *, group=None, layout: str = "bhsd",
                              head_chunks: int = 1) -> Tensor:
    """:func:`fastvideo_cute.video_sparse_attn` over a sequence-parallel group (Ulysses).

    q, k, v and ``compress_attn_weight`` are this rank's slice of the tiled sequence, in
    ``layout`` (``"bhsd"``: ``[B, H, S/P, D]``, ``"bshd"``: ``[B, S/P, H, D]``);
    ``variable_block_sizes`` / ``q_variable_block_sizes`` are the GLOBAL per-tile sizes. Returns
    this rank's slice of the output, q's shape. ``head_chunks > 1`` pipelines the rank's heads in
    that many all-to-all + attention steps (communication of one chunk overlaps the attention of
    the previous); 1 (the default) moves everything in one fused all-to-all each way.
    """
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'bhsd' or 'bshd', got {layout!r}")
    bshd = _LAYOUTS[layout]
    block = api._block_elements(block_size)
    if block not in (64, 128, 256):
        raise ValueError(f"block_size must have 64, 128 or 256 elements, got {block_size!r} ({block})")
    info = _group_for(q, group)
    shapes = check_local_qkv(q, k, v, bshd=bshd, block=block, rank=info.rank, size=info.size)
    check_global_sizes(variable_block_sizes, "variable_block_sizes", shapes.kv_len // block, info.size, block,
                       q.device)
    check_global_sizes(q_variable_block_sizes, "q_variable_block_sizes", shapes.q_len // block, info.size, block,
                       q.device)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive int, got {topk!r}")
    check_gate(compress_attn_weight, q)
    chunks = check_head_chunks(head_chunks, shapes.heads // info.size)
    fn = api.video_sparse_attn_bshd if bshd else api.video_sparse_attn
    if info.size == 1:
        return fn(q, k, v, variable_block_sizes, q_variable_block_sizes, topk, block_size, compress_attn_weight)
    gated = compress_attn_weight is not None

    def attend(t, lo, hi):
        gate = t[3] if gated else None
        return fn(t[0], t[1], t[2], variable_block_sizes, q_variable_block_sizes, topk, block_size, gate), None

    plan = Plan(info.group, info.size, bshd, shapes.heads, chunk_bounds(shapes.heads // info.size, chunks),
                attend, has_lse=False)
    return run(plan, (q, k, v, compress_attn_weight) if gated else (q, k, v))


def _block_sparse(q, k, v, block_map, variable_block_sizes, block: int, bshd: bool, group,
                  head_chunks: int) -> Tuple[Tensor, Tensor]:
    info = _group_for(q, group)
    shapes = check_local_qkv(q, k, v, bshd=bshd, block=block, rank=info.rank, size=info.size)
    qb, kvb = shapes.q_len // block * info.size, shapes.kv_len // block * info.size
    check_global_sizes(variable_block_sizes, "variable_block_sizes", shapes.kv_len // block, info.size, block,
                       q.device)
    local_map = local_block_map(block_map, batch=shapes.batch, heads=shapes.heads, size=info.size, rank=info.rank,
                                qb=qb, kvb=kvb, device=q.device)
    chunks = check_head_chunks(head_chunks, shapes.heads // info.size)
    fn = _BLOCK_SPARSE[(block, bshd)]
    if info.size == 1:
        return fn(q, k, v, block_map, variable_block_sizes)
    head_dim = local_map.dim() - 3

    def attend(t, lo, hi):
        return fn(t[0], t[1], t[2], local_map.narrow(head_dim, lo, hi - lo), variable_block_sizes)

    plan = Plan(info.group, info.size, bshd, shapes.heads, chunk_bounds(shapes.heads // info.size, chunks),
                attend, has_lse=True)
    return run(plan, (q, k, v))


def ulysses_block_sparse_attn(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor, variable_block_sizes: Tensor, *,
                              group=None, head_chunks: int = 1) -> Tuple[Tensor, Tensor]:
    """:func:`fastvideo_cute.block_sparse_attn` (64-token blocks, ``[B, H, S/P, D]``) over a
    sequence-parallel group. ``block_map`` covers the whole sequence (all heads, or this rank's);
    ``variable_block_sizes`` is global. Returns this rank's ``(out, lse)``: out q's shape, lse
    fp32 ``[B, H, S/P]`` (detached)."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 64, False, group, head_chunks)


def ulysses_block_sparse_attn_bshd(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor, variable_block_sizes: Tensor,
                                   *, group=None, head_chunks: int = 1) -> Tuple[Tensor, Tensor]:
    """:func:`ulysses_block_sparse_attn` for ``[B, S/P, H, D]`` slices (lse stays ``[B, H, S/P]``)."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 64, True, group, head_chunks)


def ulysses_block_sparse_attn_128(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor, variable_block_sizes: Tensor,
                                  *, group=None, head_chunks: int = 1) -> Tuple[Tensor, Tensor]:
    """:func:`ulysses_block_sparse_attn` with 128-token blocks, ``[B, H, S/P, D]``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 128, False, group, head_chunks)


def ulysses_block_sparse_attn_128_bshd(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor,
                                       variable_block_sizes: Tensor, *, group=None,
                                       head_chunks: int = 1) -> Tuple[Tensor, Tensor]:
    """:func:`ulysses_block_sparse_attn` with 128-token blocks, ``[B, S/P, H, D]``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 128, True, group, head_chunks)


def ulysses_block_sparse_attn_256(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor, variable_block_sizes: Tensor,
                                  *, group=None, head_chunks: int = 1) -> Tuple[Tensor, Tensor]:
    """:func:`ulysses_block_sparse_attn` with 256-token blocks, ``[B, H, S/P, D]``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 256, False, group, head_chunks)


def ulysses_block_sparse_attn_256_bshd(q: Tensor, k: Tensor, v: Tensor, block_map: Tensor,
                                       variable_block_sizes: Tensor, *, group=None,
                                       head_chunks: int = 1) -> Tuple[Tensor, Tensor]:
    """:func:`ulysses_block_sparse_attn` with 256-token blocks, ``[B, S/P, H, D]``."""
    return _block_sparse(q, k, v, block_map, variable_block_sizes, 256, True, group, head_chunks)
