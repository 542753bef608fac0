"""Adapters from the library's block-sparse contract to third-party kernels.

- :mod:`.fa4`: FlashAttention-4 (CuTe DSL) block sparsity. FA4 itself is imported lazily
  (:func:`.fa4.load_fa4`); importing this package imports only torch.
"""

from .fa4 import (
    FA4UnsupportedError,
    build_bwd_metadata,
    build_fwd_metadata,
    fa4_block_sparse_bwd,
    fa4_block_sparse_fwd,
    fa4_bwd_plan,
    fa4_fwd_plan,
    fa4_support,
    load_fa4,
)

__all__ = [
    "FA4UnsupportedError",
    "build_bwd_metadata",
    "build_fwd_metadata",
    "fa4_block_sparse_bwd",
    "fa4_block_sparse_fwd",
    "fa4_bwd_plan",
    "fa4_fwd_plan",
    "fa4_support",
    "load_fa4",
]
