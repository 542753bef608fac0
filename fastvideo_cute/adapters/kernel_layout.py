"""The permuted views the sm_90 64-token kernels take (ours, ``cute_sm90_fwd64``, and cuDNN's
blk64 forward called directly, ``cudnn_bsa_direct``): q / k / out as ``(S, D, H, B)``, v as
``(D, S, H, B)``, from the call layout (BHSD or BSHD) without a copy. Pure Python (no torch, no CuTe DSL)."""

from __future__ import annotations

from typing import Tuple

__all__ = ["permutations"]

_BSHD = ((1, 3, 2, 0), (3, 1, 2, 0))  # BSHD -> (S, D, H, B) / (D, S, H, B)
_BHSD = ((2, 3, 1, 0), (3, 2, 1, 0))  # BHSD -> (S, D, H, B) / (D, S, H, B)


def permutations(shape, bshd: bool) -> Tuple[int, int, int, Tuple[int, ...], Tuple[int, ...]]:
    """``(batch, heads, seq, qko, vp)`` of a call-layout shape: ``x.permute(qko)`` is q / k / out's
    kernel view, ``v.permute(vp)`` v's."""
    if bshd:
        b, s, h = shape[:3]
        return b, h, s, *_BSHD
    b, h, s = shape[:3]
    return b, h, s, *_BHSD
