"""Shared launch-side helpers of the fused VSA glue kernels (``vsa_*.py``): shape checks of
BHSD views, dtype names and tile sizes. Plain Python over tensor attributes: no torch import,
no Triton kernel here."""

from __future__ import annotations

from typing import Optional, Tuple

import triton

__all__ = ["dtype_name", "check_bhsd", "token_tile", "pow2_lanes"]


def dtype_name(x) -> str:
    """``'float32'`` for a ``torch.float32`` tensor, etc."""
    return str(x.dtype).rsplit(".", 1)[-1]


def check_bhsd(name: str, x, b: Optional[int] = None, h: Optional[int] = None, s: Optional[int] = None,
               d: Optional[int] = None) -> Tuple[int, int, int, int]:
    """Assert ``x`` is a 4-D ``[B, H, S, D]`` view with last stride 1 (and the given sizes)."""
    assert x.dim() == 4, f"{name} must be a 4-D [B, H, S, D] view, got shape {tuple(x.shape)}"
    assert x.stride(-1) == 1 or x.shape[-1] == 1, f"{name} must have last stride 1"
    for want, got, what in ((b, x.shape[0], "batch"), (h, x.shape[1], "heads"), (s, x.shape[2], "length"),
                            (d, x.shape[3], "head_dim")):
        assert want is None or want == got, f"{name} {what} {got} != {want}"
    return tuple(x.shape)


def pow2_lanes(n: int, lo: int = 16) -> int:
    """Power-of-two lane count covering ``n`` (at least ``lo``: tl.dot needs 16)."""
    return max(triton.next_power_of_2(int(n)), lo)


def token_tile(block: int, head_dim: int) -> Tuple[int, int]:
    """(BLOCK_T, BLOCK_D) for the token-streaming kernels: ~8K elements per chunk, BLOCK_T
    dividing the block (both powers of two)."""
    block_d = pow2_lanes(head_dim, 16)
    block_t = max(16, min(block, 8192 // block_d))
    return block_t, block_d
