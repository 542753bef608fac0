"""What a backend is told about one call: :class:`CallInfo` (static facts only: shapes, dtype,
arch, flags), built from the tensors by :func:`call_info`. A leaf of the data path: backends'
support predicates, the router and the warm-up planner all read it; it reads no tensor values."""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from .validation import has_partial_blocks

__all__ = ["CallInfo", "call_info", "arch_of"]


@dataclasses.dataclass(frozen=True)
class CallInfo:
    """One block-sparse attention call, forward (and backward when ``need_grad``)."""

    op: str  # "block_sparse"
    device_type: str
    arch: Optional[Tuple[int, int]]  # CUDA compute capability, None off-GPU
    dtype: torch.dtype
    head_dim: int
    block_size: int  # logical block size (64, 128 or 256)
    need_grad: bool
    batch: int = 1
    heads: int = 1
    q_len: int = 0
    kv_len: int = 0
    bshd: bool = False
    need_lse: bool = True  # False when the caller discards the LSE (video_sparse_attn's sparse branch)
    kv_all_full: bool = False  # every kv block full (from the cached range check; False when unknown)

    @property
    def arch_major(self) -> Optional[int]:
        return None if self.arch is None else int(self.arch[0])


def arch_of(device: torch.device) -> Optional[Tuple[int, int]]:
    """The CUDA compute capability of ``device``, None for a non-CUDA device."""
    if device.type != "cuda":
        return None
    return tuple(torch.cuda.get_device_capability(device))


def call_info(q: torch.Tensor, k: torch.Tensor, block_size: int, need_grad: bool, bshd: bool,
              need_lse: bool = True, kv_block_sizes: Optional[torch.Tensor] = None) -> CallInfo:
    s_dim, h_dim = (1, 2) if bshd else (2, 1)
    kv_all_full = kv_block_sizes is not None and not has_partial_blocks(kv_block_sizes, block_size)
    return CallInfo("block_sparse", q.device.type, arch_of(q.device), q.dtype, int(q.shape[-1]), int(block_size),
                    bool(need_grad), batch=int(q.shape[0]), heads=int(q.shape[h_dim]), q_len=int(q.shape[s_dim]),
                    kv_len=int(k.shape[s_dim]), bshd=bool(bshd), need_lse=bool(need_lse), kv_all_full=kv_all_full)
