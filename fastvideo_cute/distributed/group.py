"""The process-group facts a Ulysses call needs, read locally (no communication).

``resolve_group(group, device)`` returns ``GroupInfo(group, size, rank)``:

- ``group=None`` with ``torch.distributed`` not initialized (or not built) is a group of size 1:
  the call becomes a pass-through to the single-GPU function.
- ``group=None`` with it initialized is the default (world) group, as everywhere in
  ``torch.distributed``.
- A process that is not a member of ``group`` is an error (it would have no slice).
- An NCCL group moves CUDA tensors only: a CPU ``q`` with an NCCL group is rejected here, before
  any collective is issued (the other ranks would otherwise wait forever in theirs).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch
import torch.distributed as dist

__all__ = ["GroupInfo", "resolve_group"]


@dataclasses.dataclass(frozen=True)
class GroupInfo:
    group: Optional[Any]  # a torch.distributed ProcessGroup, or None for the default group / no group
    size: int
    rank: int  # rank within ``group``


def _backend_for(group, device: torch.device) -> Optional[str]:
    """The backend that moves ``device``'s tensors in ``group`` (``None``: cannot tell)."""
    try:
        backend = str(dist.get_backend(group))
    except (RuntimeError, ValueError):
        return None
    if ":" in backend:  # device-mapped, e.g. "cpu:gloo,cuda:nccl"
        mapping = dict(item.split(":", 1) for item in backend.split(",") if ":" in item)
        return mapping.get(device.type)
    return backend


def resolve_group(group, device: torch.device) -> GroupInfo:
    if not dist.is_available() or not dist.is_initialized():
        if group is not None:
            raise ValueError("group was given but torch.distributed is not initialized "
                             "(call torch.distributed.init_process_group first, or pass group=None)")
        return GroupInfo(None, 1, 0)
    size = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if rank < 0 or size < 1:
        raise ValueError("this process is not a member of group: a sequence-parallel call runs on every rank "
                         "of its group and only there")
    if size > 1:
        backend = _backend_for(group, device)
        if backend == "nccl" and device.type != "cuda":
            raise ValueError(f"group uses the NCCL backend, which moves CUDA tensors only; q is on {device}")
        if backend is None and ":" in str(dist.get_backend(group)):
            raise ValueError(f"group has no backend for {device.type} tensors ({dist.get_backend(group)}); "
                             f"q is on {device}")
    return GroupInfo(group, size, rank)
