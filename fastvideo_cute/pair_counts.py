"""A bool block map's pair counts on the host, started in the forward, taken in the backward.

The split backward (``adapters/cute_sm90_bwd64_split``) sizes its dS workspace by the number of
selected (q block, kv block) pairs of each (batch, head) sequence. Lists that arrive as lists bound it
by their width; a bool map's lists (``map_to_index``) are as wide as the kv blocks, so its counts must
be read. Reading them when the backward starts is a device sync that drains the queue the host had
run ahead of (measured 2026-12-07 on an H100: it cost more than the split saves). So the training
forward starts the read instead: one reduction, a non-blocking copy into pinned memory and an event
behind it (:func:`start_pair_counts`); the backward takes the counts (:func:`pair_counts`), waiting
on that event only, which is long done by then in a training step (the forward's own work, not the
queue behind it).

Entries are remembered per map tensor (its identity, checked through a weak reference, and its
version counter: a map changed in place since gets no counts) and dropped with it. Nothing is
started while a CUDA graph captures or ``torch.compile`` traces; on a CPU tensor the counts are
read at once (what the tests use). A map without an entry gets None: the caller keeps a chain that
needs no counts.
"""

from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Tuple

import torch

__all__ = ["start_pair_counts", "pair_counts"]

# id(map) -> (weak reference to the map, its version when counted, host counts, event or None)
_PENDING: Dict[int, Tuple[weakref.ref, int, torch.Tensor, Optional[object]]] = {}


def _drop(key: int) -> None:
    _PENDING.pop(key, None)


def start_pair_counts(block_map: torch.Tensor, q2k_num: torch.Tensor) -> bool:
    """Start reading the per-sequence pair counts of ``block_map`` (``q2k_num``: its lists' counts,
    ``[B, H, Qb]`` or ``[H, Qb]``; the sums run over the last dim). Returns whether an entry was made."""
    if torch.compiler.is_compiling() or block_map.is_inference():
        return False
    if q2k_num.is_cuda and torch.cuda.is_current_stream_capturing():
        return False
    sums = q2k_num.reshape(-1, q2k_num.shape[-1]).sum(-1, dtype=torch.int64)
    event = None
    if sums.is_cuda:
        host = torch.empty(sums.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(sums, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
    else:
        host = sums
    key = id(block_map)
    if key not in _PENDING:
        weakref.finalize(block_map, _drop, key)
    _PENDING[key] = (weakref.ref(block_map), block_map._version, host, event)
    return True


def pair_counts(block_map: torch.Tensor) -> Optional[List[int]]:
    """The counts :func:`start_pair_counts` started for this very map, unchanged since, as host
    ints (one per (batch, head) sequence); None when there are none. Waits on the copy's event."""
    entry = _PENDING.get(id(block_map))
    if entry is None or block_map.is_inference():
        return None
    ref, version, host, event = entry
    if ref() is not block_map or block_map._version != version:
        return None
    if event is not None:
        event.synchronize()
    return host.tolist()
