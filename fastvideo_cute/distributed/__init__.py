"""Sequence parallelism for VSA: Ulysses all-to-all over ``torch.distributed`` (NCCL on GPUs, gloo
on CPU), forward and backward.

Each rank holds a slice of the tiled sequence (whole tiles) for all heads; one fused all-to-all
gives each rank the whole sequence for ``H/P`` heads, the single-GPU function runs there (any
route), one all-to-all brings the output back. See ``docs/distributed.md``.

Modules: ``ulysses`` (public functions), ``checks`` (local argument checks), ``group``
(process-group facts), ``pipeline`` (the forward/backward schedule, an autograd Function),
``exchange`` (views, packing and the all-to-all itself).
"""

from .ulysses import (
    ulysses_block_sparse_attn,
    ulysses_block_sparse_attn_128,
    ulysses_block_sparse_attn_128_bshd,
    ulysses_block_sparse_attn_256,
    ulysses_block_sparse_attn_256_bshd,
    ulysses_block_sparse_attn_bshd,
    ulysses_video_sparse_attn,
)

__all__ = [
    "ulysses_video_sparse_attn",
    "ulysses_block_sparse_attn",
    "ulysses_block_sparse_attn_bshd",
    "ulysses_block_sparse_attn_128",
    "ulysses_block_sparse_attn_128_bshd",
    "ulysses_block_sparse_attn_256",
    "ulysses_block_sparse_attn_256_bshd",
]
