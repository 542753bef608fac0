"""The CuTe route on FlashAttention-4: VSA block maps adapted into FA4 block sparsity
(:mod:`fastvideo_cute.adapters.fa4`). FA4 wants ``[B, S, H, D]``; BHSD callers are passed as
transposed views and their output is made contiguous BHSD again (use the ``_bshd`` APIs to
avoid that copy)."""

from __future__ import annotations

import importlib.util
from typing import Tuple

import torch

from ..adapters.fa4 import fa4_block_sparse_bwd, fa4_block_sparse_fwd, fa4_support, fa4_version_problems
from ..routes import CallInfo
from ..validation import has_partial_blocks


def support(info: CallInfo) -> Tuple[bool, str]:
    if info.device_type != "cuda":
        return False, "FA4 needs CUDA tensors"
    ok, reason = fa4_support(info.arch, info.dtype, info.head_dim, info.block_size, info.block_size, info.need_grad)
    if not ok:
        return False, reason
    if importlib.util.find_spec("flash_attn") is None:
        return False, "flash-attn-4 is not installed (pip install 'fastvideo-cute[cute]': the CuTe stack, pinned)"
    problems = fa4_version_problems()
    if problems:
        return False, "CuTe stack version mismatch: " + "; ".join(map(str, problems))
    return True, "ok"


def _bshd_view(x: torch.Tensor, bshd: bool) -> torch.Tensor:
    return x if bshd else x.transpose(1, 2)


def forward(q, k, v, block_map, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
            sm_scale: float):
    # Padded keys may hold anything (the contract says it never leaks); FA4 reads partial tiles
    # whole, so zero them out of place when any tile is partial (known from the cached range check).
    # All-full blocks (also from that record) skip the partial lists and the padding pass.
    partial = has_partial_blocks(kv_block_sizes, block_size)
    out, lse = fa4_block_sparse_fwd(_bshd_view(q, bshd), _bshd_view(k, bshd), _bshd_view(v, bshd), block_map,
                                    kv_block_sizes, block_size=block_size, need_backward=need_backward,
                                    softmax_scale=sm_scale, zero_kv_padding=partial, all_full=not partial)
    out = out if bshd else out.transpose(1, 2)
    return out.contiguous(), lse


def backward(q, k, v, out, dout, lse, block_map, kv_block_sizes, *, block_size: int, bshd: bool, sm_scale: float):
    partial = has_partial_blocks(kv_block_sizes, block_size)
    dq, dk, dv = fa4_block_sparse_bwd(_bshd_view(q, bshd), _bshd_view(k, bshd), _bshd_view(v, bshd),
                                      _bshd_view(out, bshd), _bshd_view(dout, bshd), lse, block_map, kv_block_sizes,
                                      block_size=block_size, softmax_scale=sm_scale, zero_kv_padding=partial,
                                      all_full=not partial)
    if not bshd:
        dq, dk, dv = (t.transpose(1, 2) for t in (dq, dk, dv))
    return dq.contiguous(), dk.contiguous(), dv.contiguous()
