"""q2k lists of ``R * 64``-token blocks as 64-token tile lists, in one Triton launch.

What it is for: our sm_90a forward walks 64 x 64 tiles. A call with 128- or 256-token blocks
(``R = 2`` or ``4``) becomes a 64-token call: query block ``t`` becomes the ``R`` query tiles
``t * R + e`` (each with the block's list), kv block ``n`` the ``R`` kv tiles ``n * R + f`` with
sizes ``ts = clamp(size[n] - 64 f, 0, 64)`` (the valid keys stay the leading ones). Tiles with no
valid key (``ts == 0``: past a partial block's size or past the end of the keys) are dropped from
the lists, so the kernel never computes a fully masked tile; that is exact (such a tile adds
nothing to a row's sum or output), and a row whose tiles are all dropped gets count 0 (out 0,
LSE -inf: the contract for a row with no key).

Inputs: ``Idx [B, H, Qb, W]`` int32 contiguous, the first ``clamp(num, 0, W)`` entries of each
row valid kv block ids (``Num [B, H, Qb]``), ascending; ``Sizes [KVb]`` int32 (``HAS_SIZES``)
and ``seqlen_k`` (a block's keys also end at ``seqlen_k``). Outputs (caller-allocated, int32,
contiguous): ``OIdx [B, H, Qb * R, W * R]`` (the kept tiles ascending; entries past the count are
not written: never read), ``ONum [B, H, Qb * R]``, and with ``HAS_SIZES`` ``OSizes [KVb * R]``
(the tile sizes, written by the first programs). One program per logical row (more when the
tile sizes need them), no atomics, no host sync. This module does not import torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["split_q2k_launch", "TILE"]

TILE = 64


@triton.jit
def _split_q2k_kernel(
    Idx, Num, Sizes, OIdx, ONum, OSizes,
    ROWS, W, KVB, seqlen_k,
    R: tl.constexpr,
    BLOCK_J: tl.constexpr,
    HAS_SIZES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # flattened (b, h, t): logical q block rows
    j = tl.arange(0, BLOCK_J)
    w = j // R
    f = j % R
    if row < ROWS:
        count = tl.minimum(tl.maximum(tl.load(Num + row), 0), W)
        valid = w < count
        n = tl.load(Idx + row * W + w, mask=valid, other=0)
        size = tl.minimum(seqlen_k - n * (R * 64), R * 64)
        if HAS_SIZES:
            size = tl.minimum(tl.load(Sizes + n, mask=valid, other=0), size)
        ts = tl.minimum(tl.maximum(size - f * 64, 0), 64)
        keep = valid & (ts > 0)
        k = keep.to(tl.int32)
        pos = tl.cumsum(k, axis=0) - 1
        kept = tl.sum(k, axis=0)
        wr = W * R
        for e in tl.static_range(R):
            out_row = row * R + e
            tl.store(OIdx + out_row * wr + pos, n * R + f, mask=keep)
            tl.store(ONum + out_row, kept)
    if HAS_SIZES:  # the tile sizes, BLOCK_J per program over the first programs
        c = row * BLOCK_J + j
        cm = c < KVB * R
        s = tl.load(Sizes + c // R, mask=cm, other=0)
        tl.store(OSizes + c, tl.minimum(tl.maximum(s - (c % R) * 64, 0), 64), mask=cm)


def split_q2k_launch(idx, num, sizes, out_idx, out_num, out_sizes, *, ratio: int, seqlen_k: int) -> None:
    """One launch (module docstring) into caller-allocated outputs; ``sizes`` / ``out_sizes`` None
    when every block is full up to ``seqlen_k``. Launches on the current device (the caller sets
    it)."""
    B, H, Qb, W = (int(x) for x in idx.shape)
    assert ratio in (2, 4), f"ratio {ratio}: 2 or 4"
    assert tuple(num.shape) == (B, H, Qb), f"num {tuple(num.shape)} vs {(B, H, Qb)}"
    assert tuple(out_idx.shape) == (B, H, Qb * ratio, W * ratio) and out_idx.is_contiguous(), "out_idx"
    assert tuple(out_num.shape) == (B, H, Qb * ratio) and out_num.is_contiguous(), "out_num"
    assert idx.is_contiguous() and num.is_contiguous(), "idx and num must be contiguous"
    assert (sizes is None) == (out_sizes is None), "sizes and out_sizes are given together"
    kvb = 0 if sizes is None else int(sizes.numel())
    if sizes is not None:
        assert sizes.is_contiguous() and int(out_sizes.numel()) == kvb * ratio, "out_sizes"
    rows = B * H * Qb
    block_j = max(triton.next_power_of_2(W * ratio), 16)
    # enough programs to cover the tile sizes too
    programs = max(rows, triton.cdiv(kvb * ratio, block_j))
    if programs == 0:
        return
    num_warps = 1 if block_j <= 1024 else (4 if block_j <= 4096 else 8)
    _split_q2k_kernel[(programs,)](
        idx, num, sizes if sizes is not None else num, out_idx, out_num,
        out_sizes if out_sizes is not None else out_num,
        rows, W, kvb, int(seqlen_k),
        R=int(ratio), BLOCK_J=block_j, HAS_SIZES=sizes is not None, num_warps=num_warps,
    )
