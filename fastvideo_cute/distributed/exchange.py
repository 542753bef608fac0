"""The Ulysses all-to-all: one fused collective moves several tensors between the two shardings.

Two shardings of a 4-D attention tensor over a group of ``P`` ranks:

- **sequence-sharded** (what a rank holds outside attention): tokens ``[r*S_l, (r+1)*S_l)`` of
  the (tiled) sequence, all ``H`` heads: ``[B, S_l, H, D]`` (BSHD) or ``[B, H, S_l, D]`` (BHSD);
- **head-sharded** (what attention needs): all ``S = P*S_l`` tokens, heads
  ``[r*H_l, (r+1)*H_l)`` with ``H_l = H / P``: ``[B, S, H_l, D]`` or ``[B, H_l, S, D]``.

Both are viewed (no copy) as the same 5-D "chunk" tensor whose leading dim is the peer rank:
``heads_view(local)[j]`` is what this rank sends to rank ``j`` (its tokens, rank j's heads) and
``seq_view(full)[i]`` is what it receives from rank ``i`` (rank i's tokens, its heads), so
sequence -> heads is: pack ``heads_view`` of every tensor into one ``[P, total]`` buffer, one
``all_to_all_single``, unpack into ``seq_view`` of the outputs. Heads -> sequence is the same
with the two views swapped, which is also the transpose (the backward) of the first.

``start`` packs and issues the collective with ``async_op=True`` and returns at once (on NCCL
the collective runs on NCCL's stream; ``finish`` makes the current stream wait for it, no host
block); ``finish`` unpacks. The buffer travels as bytes, so tensors of one dtype and byte views
of others (the fp32 LSE next to a bf16 output) share one collective. Every tensor of one
exchange must have the same dtype.
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["heads_view", "seq_view", "Pending", "start", "finish", "head_slice"]


def heads_view(x: Tensor, parts: int, bshd: bool) -> Tensor:
    """Sequence-sharded ``x`` -> ``[P, B, S_l, H/P, D]`` (BSHD) / ``[P, B, H/P, S_l, D]`` (BHSD), a view."""
    h_dim = 2 if bshd else 1
    return x.unflatten(h_dim, (parts, x.shape[h_dim] // parts)).movedim(h_dim, 0)


def seq_view(x: Tensor, parts: int, bshd: bool) -> Tensor:
    """Head-sharded ``x`` -> the same 5-D chunk shape as :func:`heads_view`, a view."""
    s_dim = 1 if bshd else 2
    return x.unflatten(s_dim, (parts, x.shape[s_dim] // parts)).movedim(s_dim, 0)


def head_slice(chunk: Tensor, lo: int, hi: int, bshd: bool) -> Tensor:
    """Heads ``[lo, hi)`` of a 5-D chunk tensor (its head dim is 3 for BSHD, 2 for BHSD)."""
    return chunk.narrow(3 if bshd else 2, lo, hi - lo)


@dataclasses.dataclass
class Pending:
    """An issued all-to-all: its work handle and the buffers it reads and writes."""

    work: object
    send: Tensor
    recv: Tensor
    counts: List[int]


def start(sources: Sequence[Tensor], group) -> Pending:
    """Pack the 5-D ``sources`` (leading dim = destination rank) into one buffer and issue one
    asynchronous ``all_to_all_single`` over ``group``."""
    parts, dtype, device = sources[0].shape[0], sources[0].dtype, sources[0].device
    counts = [s[0].numel() for s in sources]
    send = torch.empty((parts, sum(counts)), dtype=dtype, device=device)
    off = 0
    for src, n in zip(sources, counts):
        if src.dtype != dtype or src.shape[0] != parts:
            raise AssertionError("one exchange moves tensors of one dtype and one peer count")
        send[:, off:off + n].view(src.shape).copy_(src)
        off += n
    recv = torch.empty_like(send)
    work = dist.all_to_all_single(recv.view(torch.uint8), send.view(torch.uint8), group=group, async_op=True)
    return Pending(work, send, recv, counts)


def finish(pending: Pending, dests: Sequence[Tensor]) -> None:
    """Wait for ``pending`` and unpack it into the 5-D ``dests`` (leading dim = source rank), in
    the order their sources were packed."""
    pending.work.wait()
    off = 0
    for dst, n in zip(dests, pending.counts):
        dst.copy_(pending.recv[:, off:off + n].view(dst.shape))
        off += n
    pending.send = pending.recv = None  # the caching allocator may reuse them from here on
