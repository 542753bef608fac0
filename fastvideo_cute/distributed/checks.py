"""Argument checks of the Ulysses functions: local, before any collective is issued.

Every check reads only this rank's arguments, so a bad call raises the same error on every rank
(when the ranks pass consistent arguments, as they must) and no rank is left waiting inside a
collective. What cannot be checked without communicating -- that every rank passes the same
global ``variable_block_sizes``, ``topk``, map and shapes -- is the caller's contract.

- ``check_slice``: a rank's slice of the tiled sequence is a positive whole number of tiles;
- ``check_heads``: the head count divides by the group size;
- ``check_global_sizes``: the per-tile sizes are the GLOBAL vector (one entry per tile of the
  whole sequence), checked (range included) by the library's own ``check_block_sizes``;
- ``local_block_map``: a global (all heads) or local (this rank's heads) block map -> this
  rank's ``[B, H/P, Qb, KVb]`` map over the whole sequence (a view);
- ``check_gate`` and ``check_head_chunks``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..validation import check_block_sizes, check_qkv

__all__ = ["check_slice", "check_heads", "check_global_sizes", "local_block_map", "check_gate",
           "check_head_chunks", "check_local_qkv"]


def check_slice(name: str, local_len: int, block: int, rank: int, size: int) -> None:
    if local_len <= 0 or local_len % block:
        raise ValueError(f"{name} holds {local_len} tokens on rank {rank} of {size}: each rank's slice of the tiled "
                         f"sequence must be a positive whole number of {block}-token tiles (split on tile "
                         f"boundaries; pad the sequence with empty tiles, size 0, to a multiple of {size} tiles)")


def check_heads(heads: int, size: int) -> None:
    if heads % size:
        raise ValueError(f"heads ({heads}) must be divisible by the sequence-parallel group size ({size}): each "
                         f"rank attends over heads/group-size heads (no padding of heads is done)")


def check_local_qkv(q, k, v, *, bshd: bool, block: int, rank: int, size: int):
    """Slices whole tiles, heads divisible, then the library's q/k/v checks on the local tensors."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(x.shape)}")
    s_dim, h_dim = (1, 2) if bshd else (2, 1)
    check_slice("q", q.shape[s_dim], block, rank, size)
    check_slice("k", k.shape[s_dim], block, rank, size)
    check_heads(q.shape[h_dim], size)
    return check_qkv(q, k, v, bshd=bshd, block_size=block)


def check_global_sizes(sizes, name: str, local_blocks: int, size: int, block: int, device: torch.device) -> Tensor:
    n = sizes.numel() if isinstance(sizes, Tensor) and sizes.dim() == 1 else None
    if n is not None and n != local_blocks * size:
        hint = " (it looks like this rank's slice: pass the global vector)" if n == local_blocks else ""
        raise ValueError(f"{name} must be the GLOBAL per-tile sizes, identical on every rank: one entry per tile of "
                         f"the whole sequence, {size} ranks x {local_blocks} local tiles = {local_blocks * size}, "
                         f"got {n}{hint}")
    return check_block_sizes(sizes, local_blocks * size, block, device, name=name)


def local_block_map(block_map, *, batch: int, heads: int, size: int, rank: int, qb: int, kvb: int,
                    device: torch.device) -> Tensor:
    """This rank's heads of ``block_map`` over the whole sequence.

    Accepted: ``[B, H, Qb, KVb]`` / ``[H, Qb, KVb]`` with every head (the rank reads heads
    ``[rank*H/P, (rank+1)*H/P)``), or ``[B, H/P, Qb, KVb]`` / ``[H/P, Qb, KVb]`` already sliced to
    this rank's heads. ``Qb`` and ``KVb`` count the tiles of the whole sequence.
    """
    if not isinstance(block_map, Tensor):
        raise TypeError(f"block_map must be a torch.Tensor, got {type(block_map).__name__}")
    if block_map.dtype != torch.bool:
        raise TypeError(f"block_map must be a bool tensor, got {block_map.dtype}")
    if block_map.device != device:
        raise ValueError(f"block_map must be on q's device {device}, got {block_map.device}")
    hl = heads // size
    shape = tuple(block_map.shape)
    lead = shape[:-3]
    ok_lead = block_map.dim() == 3 or (block_map.dim() == 4 and lead == (batch,))
    if ok_lead and shape[-2:] == (qb, kvb) and shape[-3] in (heads, hl):
        if shape[-3] == heads and heads != hl:
            return block_map.narrow(block_map.dim() - 3, rank * hl, hl)
        return block_map
    raise ValueError(f"block_map must cover the whole sequence (Qb = {qb}, KVb = {kvb} tiles) for all heads "
                     f"[B, H, Qb, KVb] = {[batch, heads, qb, kvb]} (or [H, Qb, KVb]), or for this rank's heads "
                     f"[B, H/P, Qb, KVb] = {[batch, hl, qb, kvb]} (or [H/P, Qb, KVb]); got {list(shape)}")


def check_gate(gate, q: Tensor) -> None:
    if gate is None:
        return
    if not isinstance(gate, Tensor) or gate.shape != q.shape:
        raise ValueError(f"compress_attn_weight must be a tensor of q's (local) shape {tuple(q.shape)}, "
                         f"got {getattr(gate, 'shape', None)}")
    if gate.dtype != q.dtype:
        raise TypeError(f"compress_attn_weight must have q's dtype {q.dtype}, got {gate.dtype}")
    if gate.device != q.device:
        raise ValueError(f"compress_attn_weight must be on q's device {q.device}, got {gate.device}")


def check_head_chunks(head_chunks, heads_local: int) -> int:
    if isinstance(head_chunks, bool) or not isinstance(head_chunks, int) or not 1 <= head_chunks <= heads_local:
        raise ValueError(f"head_chunks must be an int in [1, heads per rank = {heads_local}], got {head_chunks!r}")
    return head_chunks
