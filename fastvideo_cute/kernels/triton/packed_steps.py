"""The q2k lists of 64-token kv tiles as packed step lists, in one Triton launch: the lists of the
sm_90 64-token forward's ``packed_steps`` (``kernels/cute/block_sparse_fwd64/block_sparse_fwd64_sm90``,
host side ``adapters.cute_sm90_fwd64.pack_steps``), which runs a whole tile per step and the 16-key
pieces of partial tiles four to a step (``kernels.cute.common.softmax.mask_keys_pieces_mn`` masks
a ragged piece's keys).

Contract: int32 ``idx [R, W]`` (``R = B*H*Qb`` rows, each a list of kv tiles in ``[0, KVb)``) with
counts ``num [R]`` (clamped to ``[0, W]``; entries past a row's count are never read), and
optionally int32 ``sizes [KVb]``, the valid keys of each kv tile (absent: 64 each); tile ``t``
keeps ``valid = clamp(min(sizes[t], kv_len - 64 t), 0, 64)`` keys. A step is four int32 words,
each ``v | whole << 5 | p << 6``: ``p`` a global 16-key piece (key row // 16, ``4 t + i`` for
piece ``i`` of tile ``t``), ``v`` its valid keys (1..16; 0: an unused slot, word 0), ``whole``
set on a whole tile's step. Outputs: ``steps [R, 4 W]``, each row's steps (step ``j`` in words
``4 j .. 4 j + 3``): first one step per whole tile (``valid == 64``) in list order, its words
``(4 t << 6 | 32 | 16, 0, 0, 0)``; then the ``ceil(valid / 16)`` pieces of every partial tile
(``0 < valid < 64``) in list order, piece ``i`` with ``v = min(16, valid - 16 i)``, laid out
consecutively four to a step (a tile's pieces may straddle two steps), the last step's unused
slots 0; empty tiles (``valid == 0``) give nothing. ``nsteps [R]``: ``nwhole + ceil(npieces /
4)``, at most the count. Words of steps at or past ``nsteps`` are left as they were (never read).

Dataflow: one program per ``ROWS`` rows, the whole width (``BLOCK_W = next_power_of_2(W)``) in
registers: the row's entries, their valid keys (a gather from ``sizes`` when ``HAS_SIZES``), the
exclusive prefix sums (``tl.cumsum``) of the whole tiles (a whole tile's step) and of the pieces
(a partial tile's first slot past the whole steps); one store per word of the whole steps, one per
piece index ``i < 4`` for the partial tiles' pieces, then the last step's padding slots. Every
store of a program goes to its own address; no host sync, no atomics. This module does not import
torch; the launch helper writes into caller-allocated tensors (CPU tensors under
``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["packed_steps", "TILE", "PIECE", "WHOLE_FLAG"]

#: keys of a kv tile, of a piece, and the word's whole-tile flag (bits 0-4: v, bit 5: whole, 6..: p)
TILE = 64
PIECE = 16
WHOLE_FLAG = 32


@triton.jit
def _packed_steps_kernel(IDX, NUM, SIZES, STEPS, NSTEPS, R, W, kv_len,
                         HAS_SIZES: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < R
    r64 = rows.to(tl.int64)
    slots = tl.arange(0, BLOCK_W)
    num = tl.minimum(tl.maximum(tl.load(NUM + r64, mask=rmask, other=0), 0), W)
    used = rmask[:, None] & (slots < W)[None, :] & (slots[None, :] < num[:, None])
    t = tl.load(IDX + r64[:, None] * W + slots[None, :], mask=used, other=0)
    if HAS_SIZES:
        size = tl.load(SIZES + t, mask=used, other=0)
    else:
        size = tl.full([ROWS, BLOCK_W], 64, tl.int32)
    valid = tl.minimum(tl.maximum(tl.minimum(size, kv_len - 64 * t), 0), 64)
    valid = tl.where(used, valid, 0)
    whole = (valid == 64).to(tl.int32)
    part = (valid > 0) & (valid < 64)
    npc = tl.where(part, (valid + 15) // 16, 0)
    rank = tl.cumsum(whole, 1) - whole  # a whole tile's step
    poff = tl.cumsum(npc, 1) - npc  # a partial tile's first piece slot past the whole steps
    nwhole = tl.sum(whole, 1)
    npieces = tl.sum(npc, 1)
    tl.store(NSTEPS + r64, nwhole + (npieces + 3) // 4, mask=rmask)
    row = STEPS + r64[:, None] * (4 * W)
    is_whole = whole != 0
    tl.store(row + rank * 4, (4 * t) << 6 | 48, mask=is_whole)
    for k in tl.static_range(1, 4):
        tl.store(row + rank * 4 + k, tl.zeros([ROWS, BLOCK_W], tl.int32), mask=is_whole)
    first = nwhole[:, None] * 4 + poff
    for i in tl.static_range(4):
        word = (4 * t + i) << 6 | tl.minimum(valid - 16 * i, 16)
        tl.store(row + first + i, word, mask=part & (npc > i))
    pad = tl.arange(0, 4)
    end = (nwhole * 4 + npieces)[:, None]
    npad = ((4 - npieces % 4) % 4)[:, None]
    tl.store(row + end + pad[None, :], tl.zeros([ROWS, 4], tl.int32), mask=rmask[:, None] & (pad[None, :] < npad))


def packed_steps(idx, num, sizes, kv_len: int, steps, nsteps, rows_per_program: int = 4) -> None:
    """Write the packed step lists of ``idx`` / ``num`` (module docstring) into ``steps``
    (``[R, 4 W]`` int32, contiguous) and ``nsteps`` (``[R]`` int32). ``idx`` ``[R, W]`` and ``num``
    ``[R]`` int32, contiguous; ``sizes`` ``[KVb]`` int32, contiguous, or None (64 keys a tile);
    ``kv_len >= 0`` the key sequence length (it cuts the last tile); ``rows_per_program`` a power
    of 2."""
    if len(idx.shape) != 2:
        raise ValueError(f"packed_steps: idx must be 2-D [R, W], got shape {tuple(idx.shape)}")
    r, w = idx.shape
    if tuple(num.shape) != (r,):
        raise ValueError(f"packed_steps: num must have shape [{r}], got {tuple(num.shape)}")
    if tuple(steps.shape) != (r, 4 * w):
        raise ValueError(f"packed_steps: steps must have shape [{r}, {4 * w}], got {tuple(steps.shape)}")
    if tuple(nsteps.shape) != (r,):
        raise ValueError(f"packed_steps: nsteps must have shape [{r}], got {tuple(nsteps.shape)}")
    if sizes is not None and len(sizes.shape) != 1:
        raise ValueError(f"packed_steps: sizes must be 1-D [KVb] or None, got shape {tuple(sizes.shape)}")
    if kv_len < 0:
        raise ValueError(f"packed_steps: kv_len must be >= 0, got {kv_len!r}")
    if rows_per_program < 1 or rows_per_program & (rows_per_program - 1):
        raise ValueError(f"packed_steps: rows_per_program must be a power of 2, got {rows_per_program!r}")
    if r == 0:
        return
    grid = (triton.cdiv(r, rows_per_program),)
    _packed_steps_kernel[grid](idx, num, idx if sizes is None else sizes, steps, nsteps, r, w, kv_len,
                               HAS_SIZES=sizes is not None, ROWS=rows_per_program,
                               BLOCK_W=triton.next_power_of_2(max(w, 1)), num_warps=4)
