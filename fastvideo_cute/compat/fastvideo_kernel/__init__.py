"""A drop-in for FastVideo's ``fastvideo_kernel`` (its VSA part), running on fastvideo_cute.

Switch with one import::

    import fastvideo_cute.compat.fastvideo_kernel as fastvideo_kernel

or make every later ``import fastvideo_kernel`` / ``from fastvideo_kernel... import ...`` in the
process resolve here (call it before the code that imports FastVideo's package)::

    from fastvideo_cute.compat import install_as_fastvideo_kernel
    install_as_fastvideo_kernel()

Names (FastVideo 0.3.5's VSA exports, same signatures): ``video_sparse_attn``,
``video_sparse_attn_bshd``, ``block_sparse_attn``, ``block_sparse_attn_from_indices``,
``block_sparse_attn_varlen``, and the ``vsa_utils`` helpers (``VSA_TILE_SIZE``, ``get_tile_partition_indices``,
``get_reverse_tile_partition_indices``, ``construct_variable_block_sizes``,
``get_non_pad_index``, ``build_vsa_metadata``). Submodules mirror FastVideo's layout (``ops``,
``block_sparse_attn``, ``block_sparse_attn_256`` with ``block_sparse_attn_128`` / ``_256`` and
their ``_bshd`` twins, ``block_sparse_attn_varlen``, ``vsa_utils``); as in FastVideo's package,
the attributes ``block_sparse_attn`` and ``block_sparse_attn_varlen`` are the functions.
FastVideo's non-VSA exports (sliding-tile attention, MoBA, TurboDiffusion ops) are not
provided: importing one raises ``ImportError`` (attribute access: ``AttributeError`` with the
reason). Where behaviour deliberately differs from FastVideo's, docs/compat.md has the table.
"""

from __future__ import annotations

from .block_sparse_attn import block_sparse_attn, block_sparse_attn_from_indices
from . import block_sparse_attn_256, ops, vsa_utils  # noqa: F401  (modules, as in FastVideo's package)
from .block_sparse_attn_varlen import block_sparse_attn_varlen
from .ops import video_sparse_attn, video_sparse_attn_bshd
from .vsa_utils import (VSA_TILE_SIZE, build_vsa_metadata, construct_variable_block_sizes, get_non_pad_index,
                        get_reverse_tile_partition_indices, get_tile_partition_indices)

__version__ = "0.3.5+fastvideo.cute"

__all__ = [
    "video_sparse_attn",
    "video_sparse_attn_bshd",
    "block_sparse_attn",
    "block_sparse_attn_from_indices",
    "block_sparse_attn_varlen",
    "VSA_TILE_SIZE",
    "get_tile_partition_indices",
    "get_reverse_tile_partition_indices",
    "construct_variable_block_sizes",
    "get_non_pad_index",
    "build_vsa_metadata",
    "__version__",
]

SUBMODULES = ("ops", "block_sparse_attn", "block_sparse_attn_256", "block_sparse_attn_varlen", "vsa_utils")

_NOT_PROVIDED = {
    "sliding_tile_attention": "sliding-tile attention (STA)",
    "moba_attn_varlen": "MoBA attention",
    "process_moba_input": "MoBA attention",
    "process_moba_output": "MoBA attention",
    "Int8Linear": "TurboDiffusion ops",
    "FastRMSNorm": "TurboDiffusion ops",
    "FastLayerNorm": "TurboDiffusion ops",
    "int8_linear": "TurboDiffusion ops",
    "int8_quant": "TurboDiffusion ops",
}


def __getattr__(name: str):
    if name in _NOT_PROVIDED:
        raise AttributeError(f"fastvideo_cute.compat.fastvideo_kernel does not provide {name!r}: "
                             f"{_NOT_PROVIDED[name]} is not part of fastvideo_cute (only VSA is); install FastVideo's "
                             f"fastvideo-kernel for it")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
