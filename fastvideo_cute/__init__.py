"""fastvideo-cute: VSA (Video Sparse Attention) block-sparse attention for video DiTs.

Routes: Triton (any CUDA GPU; CPU tensors under ``TRITON_INTERPRET=1``) and CuTe (opt-in with
``FASTVIDEO_VSA_CUTEDSL=1``: FlashAttention-4 block sparsity and our own CuTe DSL kernels).
Importing this package imports neither Triton kernels nor the CuTe DSL: they load on first use.
"""

from .api import (
    block_sparse_attn,
    block_sparse_attn_128,
    block_sparse_attn_128_bshd,
    block_sparse_attn_256,
    block_sparse_attn_256_bshd,
    block_sparse_attn_bshd,
    topk_block_map,
    video_sparse_attn,
    video_sparse_attn_bshd,
)
from .api_indices import (block_sparse_attn_128_bshd_from_indices, block_sparse_attn_128_from_indices,
                          block_sparse_attn_256_bshd_from_indices, block_sparse_attn_256_from_indices,
                          block_sparse_attn_bshd_from_indices, block_sparse_attn_from_indices)
from .metadata import expand_block_map, invert_indices, map_to_index, split_block_sizes
from .routes import RouteError
from .varlen import block_sparse_attn_varlen, video_sparse_attn_varlen
from .tiling import (from_tiles, padded_length, tile_counts, tile_gather_index, tile_scatter_index, to_tiles,
                     variable_block_sizes)

from ._version import __version__

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
    "block_sparse_attn_from_indices",
    "block_sparse_attn_bshd_from_indices",
    "block_sparse_attn_128_from_indices",
    "block_sparse_attn_128_bshd_from_indices",
    "block_sparse_attn_256_from_indices",
    "block_sparse_attn_256_bshd_from_indices",
    "block_sparse_attn_varlen",
    "video_sparse_attn_varlen",
    "map_to_index",
    "invert_indices",
    "expand_block_map",
    "split_block_sizes",
    "RouteError",
    "tile_counts",
    "padded_length",
    "variable_block_sizes",
    "tile_gather_index",
    "tile_scatter_index",
    "to_tiles",
    "from_tiles",
    "__version__",
]

import os as _os  # noqa: E402

if _os.environ.get("FASTVIDEO_CUTE_CACHE_DIR", "").strip():
    # One cache root for FA4, Triton and our CuTe kernels (docs/warmup.md); fills in only the
    # per-tool variables that are not already set (cache_dirs is a leaf: no warm-up, no kernels).
    from .cache_dirs import configure_cache_from_env as _configure_cache

    _configure_cache()
