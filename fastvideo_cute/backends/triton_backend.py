"""The Triton route: block-sparse forward/backward on any CUDA GPU (and on CPU tensors under
``TRITON_INTERPRET=1``). Logical 64/128-token blocks run natively; 256-token blocks run as
128-token physical tiles (2x2 expansion of the map, sizes split)."""

from __future__ import annotations

import importlib.util
from typing import Optional, Tuple

import torch

from ..metadata import expand_block_map, map_to_index, split_block_sizes
from ..routes import CallInfo, env_flag

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIMS = (32, 64, 128)

# logical block size -> (physical q tile, physical kv tile)
PHYSICAL_TILES = {64: (64, 64), 128: (128, 128), 256: (128, 128)}


def support(info: CallInfo) -> Tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    if info.device_type == "cpu":
        if not env_flag("TRITON_INTERPRET"):
            return False, "tensors are on the CPU; the Triton route runs on CPU tensors only under TRITON_INTERPRET=1"
    elif info.device_type != "cuda":
        return False, f"device type {info.device_type!r} is not supported (CUDA, or CPU under TRITON_INTERPRET=1)"
    if info.dtype not in _DTYPES:
        return False, f"dtype {info.dtype} is not supported (float16, bfloat16, float32)"
    if info.head_dim not in HEAD_DIMS:
        return False, f"head_dim {info.head_dim} is not supported (one of {HEAD_DIMS})"
    if info.block_size not in PHYSICAL_TILES:
        return False, f"block_size {info.block_size} is not supported (one of {tuple(PHYSICAL_TILES)})"
    return True, "ok"


def physical_layout(block_map: torch.Tensor, kv_block_sizes: torch.Tensor, block_size: int):
    """Logical map/sizes -> (physical map, physical sizes, q tile, kv tile)."""
    q_tile, kv_tile = PHYSICAL_TILES[block_size]
    phys_map = expand_block_map(block_map, block_size // q_tile, block_size // kv_tile)
    phys_sizes = split_block_sizes(kv_block_sizes, block_size // kv_tile, kv_tile)
    return phys_map, phys_sizes, q_tile, kv_tile


def _bhsd(x: torch.Tensor, bshd: bool) -> torch.Tensor:
    return x.transpose(1, 2) if bshd else x


def forward(q, k, v, block_map, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
            sm_scale: float, config: Optional[dict] = None):
    from ..kernels.triton.block_sparse_fwd import block_sparse_attn_fwd

    del need_backward  # the Triton forward saves nothing extra for its backward
    phys_map, phys_sizes, q_tile, kv_tile = physical_layout(block_map, kv_block_sizes, block_size)
    q2k_idx, q2k_num = map_to_index(phys_map)
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    qb = _bhsd(q, bshd)
    lse = torch.empty(qb.shape[:3], dtype=torch.float32, device=q.device)
    block_sparse_attn_fwd(qb, _bhsd(k, bshd), _bhsd(v, bshd), q2k_idx, q2k_num, phys_sizes,
                          _bhsd(out, bshd), lse, sm_scale=sm_scale, q_block=q_tile, kv_block=kv_tile,
                          config=config)
    return out, lse


def backward(q, k, v, out, dout, lse, block_map, kv_block_sizes, *, block_size: int, bshd: bool,
             sm_scale: float, config: Optional[dict] = None):
    from ..kernels.triton.block_sparse_bwd import block_sparse_attn_bwd

    phys_map, phys_sizes, q_tile, kv_tile = physical_layout(block_map, kv_block_sizes, block_size)
    q2k_idx, q2k_num = map_to_index(phys_map)
    k2q_idx, k2q_num = map_to_index(phys_map.transpose(-2, -1))
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    block_sparse_attn_bwd(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), _bhsd(out, bshd), _bhsd(dout, bshd), lse,
                          q2k_idx, q2k_num, k2q_idx, k2q_num, phys_sizes,
                          _bhsd(dq, bshd), _bhsd(dk, bshd), _bhsd(dv, bshd),
                          sm_scale=sm_scale, q_block=q_tile, kv_block=kv_tile, config=config)
    return dq, dk, dv
