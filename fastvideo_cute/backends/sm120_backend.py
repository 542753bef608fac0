"""The CuTe route on GB10 / RTX Blackwell (sm_120/121): our own mma.sync + TMA forward
(:mod:`fastvideo_cute.adapters.cute_sm120`), 128-token tiles (256-token blocks as 2x2 tiles).

What it serves, and why no more (the library's contract is the reference, not the kernel's):
- inference only: the kernel has no backward, so grad-tracking calls go to Triton;
- no LSE: it writes the output only, so it serves only calls whose LSE is discarded (the sparse
  branch of ``video_sparse_attn``); ``block_sparse_attn_*`` return an LSE and go elsewhere;
- every kv block full: the kernel follows seed 004's self-attention contract and also zeroes
  query rows past each block's size, which equals the library's contract (every query row
  attends) only when no block is partial; ragged sizes go to Triton;
- q_len == kv_len, bf16, head_dim 128, within the kernel's launch limits.
On sm_90 it is reachable by name only (``FASTVIDEO_VSA_BACKEND=sm120``), for testing and
benchmarking; FA4 stays the CuTe route there.
"""

from __future__ import annotations

import importlib.util
from typing import Tuple

import torch

from ..metadata import map_to_index
from ..routes import CallInfo
from .triton_backend import physical_layout

_TILE = 128


def support(info: CallInfo) -> Tuple[bool, str]:
    from ..adapters.cute_sm120 import HEAD_DIM, SUPPORTED_CAPABILITIES, sm120_within_launch_limits

    if info.device_type != "cuda" or info.arch is None:
        return False, "needs CUDA tensors"
    if tuple(info.arch) not in SUPPORTED_CAPABILITIES:
        return False, f"the mma.sync + TMA kernel targets sm_90/sm_120/sm_121, not sm_{info.arch[0]}{info.arch[1]}"
    if info.need_grad:
        return False, "inference only (the sm_120 kernel has no backward)"
    if info.need_lse:
        return False, "the sm_120 kernel returns no LSE (it serves video_sparse_attn's sparse branch)"
    if info.dtype != torch.bfloat16:
        return False, f"bfloat16 only, got {info.dtype}"
    if info.head_dim != HEAD_DIM:
        return False, f"head_dim {HEAD_DIM} only, got {info.head_dim}"
    if info.block_size not in (128, 256):
        return False, f"128- or 256-token blocks only, got {info.block_size}"
    if info.q_len != info.kv_len:
        return False, f"q_len == kv_len only, got {info.q_len} and {info.kv_len}"
    if not info.kv_all_full:
        return False, ("ragged variable_block_sizes: the kernel zeroes query rows past each block's size "
                       "(the library's contract has every query row attend): exact only when every block is full")
    blocks = info.kv_len // _TILE
    if not sm120_within_launch_limits(info.batch, info.heads, info.q_len, blocks, blocks):
        return False, "exceeds the kernel's launch limits (grid y, int32 TMA rows or list offsets)"
    if importlib.util.find_spec("cutlass") is None:
        return False, "the CuTe DSL (nvidia-cutlass-dsl) is not installed (pip install 'fastvideo-cute[cute]')"
    return True, "ok"


def forward(q, k, v, block_map, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
            sm_scale: float):
    from ..adapters.cute_sm120 import sm120_block_sparse_fwd

    if need_backward:
        raise RuntimeError("sm120 backend: inference only")
    if abs(sm_scale - q.shape[-1] ** -0.5) > 1e-12:
        raise RuntimeError("sm120 backend: the kernel uses softmax scale head_dim ** -0.5")
    phys_map, phys_sizes, _, _ = physical_layout(block_map, kv_block_sizes, block_size)
    q2k_idx, q2k_num = map_to_index(phys_map)
    qb, kb, vb = ((x.transpose(1, 2) if bshd else x).contiguous() for x in (q, k, v))
    out = sm120_block_sparse_fwd(qb, kb, vb, q2k_idx, q2k_num, phys_sizes)
    if bshd:
        out = out.transpose(1, 2).contiguous()
    # Not an LSE: this backend serves only calls that discard it (support() checks need_lse).
    lse = torch.full((qb.shape[0], qb.shape[1], qb.shape[2]), float("nan"), dtype=torch.float32, device=q.device)
    return out, lse


def backward(*args, **kwargs):
    raise RuntimeError("sm120 backend: inference only (the router never sends it a backward)")
