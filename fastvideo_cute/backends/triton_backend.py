"""The Triton route: block-sparse forward/backward on any CUDA GPU (and on CPU tensors under
``TRITON_INTERPRET=1``). Logical 64/128-token blocks run natively; 256-token blocks run as
128-token physical tiles (2x2 expansion of the map, sizes split).

Launches on CPU tensors (the Triton interpreter) are serialised behind one lock: the
interpreter keeps per-process state that concurrent launches from several threads corrupt
(``InterpreterError``). GPU launches are not serialised."""

from __future__ import annotations

import os
import threading
from typing import Dict, Optional

import torch

from ..call import CallInfo
from ..metadata import BlockSparsity, map_to_index, physical_layout, split_block_sizes
from ._triton_keys import triton_detail
from .base import CompileKey, Verdict, basic_key, module_installed

__all__ = ["TritonBackend", "HEAD_DIMS", "PHYSICAL_TILES", "MAX_GRID_Y"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HEAD_DIMS = (32, 64, 128)
# logical block size -> (physical q tile, physical kv tile)
PHYSICAL_TILES = {64: (64, 64), 128: (128, 128), 256: (128, 128)}
# The kernels launch batch * heads programs on grid axis 1, whose CUDA limit is 65535.
MAX_GRID_Y = 65535

_INTERPRETER_LOCK = threading.Lock()


def interpreting() -> bool:
    """Triton's own reading of ``TRITON_INTERPRET`` (it accepts 1/true/on/yes, case-insensitive)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


def _bhsd(x: torch.Tensor, bshd: bool) -> torch.Tensor:
    return x.transpose(1, 2) if bshd else x


class _Serialised:
    """Holds the interpreter lock around a launch on CPU tensors; a no-op on GPU tensors."""

    def __init__(self, device: torch.device):
        self.lock = _INTERPRETER_LOCK if device.type == "cpu" else None

    def __enter__(self):
        if self.lock is not None:
            self.lock.acquire()

    def __exit__(self, *exc):
        if self.lock is not None:
            self.lock.release()


class TritonBackend:
    name = "triton"
    head_dims = HEAD_DIMS

    def verified_on(self, arch) -> bool:
        return True  # any CUDA GPU (tested on the H200) and the CPU interpreter

    def support(self, call: CallInfo) -> Verdict:
        if not module_installed("triton"):
            return False, "triton is not installed"
        if call.device_type == "cpu":
            if not interpreting():
                return False, ("tensors are on the CPU; the Triton route runs on CPU tensors only under "
                               "TRITON_INTERPRET=1")
        elif call.device_type != "cuda":
            return False, f"device type {call.device_type!r} is not supported (CUDA, or CPU under TRITON_INTERPRET=1)"
        if call.dtype not in _DTYPES:
            return False, f"dtype {call.dtype} is not supported (float16, bfloat16, float32)"
        if call.head_dim not in HEAD_DIMS:
            return False, f"head_dim {call.head_dim} is not supported (one of {HEAD_DIMS})"
        if call.block_size not in PHYSICAL_TILES:
            return False, f"block_size {call.block_size} is not supported (one of {tuple(PHYSICAL_TILES)})"
        if call.batch * call.heads > MAX_GRID_Y:
            return False, (f"batch * heads = {call.batch * call.heads} exceeds the kernels' grid limit "
                           f"{MAX_GRID_Y} (CUDA grid axis y); split the batch")
        return True, "ok"

    def compile_keys(self, call: CallInfo) -> Dict[str, CompileKey]:
        directions = ("fwd", "bwd") if call.need_grad else ("fwd",)
        tiles = PHYSICAL_TILES[call.block_size]
        return {d: basic_key(self.name, call, d, call.block_size, triton_detail(call, d, *tiles)) for d in directions}

    def forward(self, q, k, v, sparsity, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
                sm_scale: float, kv_padding_zero: bool = False, config: Optional[dict] = None):
        from ..kernels.triton.block_sparse_fwd import block_sparse_attn_fwd

        del need_backward  # the Triton forward saves nothing extra for its backward
        q_tile, kv_tile = PHYSICAL_TILES[block_size]
        sp = BlockSparsity.of(sparsity)
        if q_tile == kv_tile == block_size:  # physical = logical: the lists as they are (ascending)
            q2k_idx, q2k_num = sp.q2k()
            phys_sizes = split_block_sizes(kv_block_sizes, 1, kv_tile)
        else:
            phys_map, phys_sizes = physical_layout(sp.block_map(), kv_block_sizes, block_size, q_tile, kv_tile)
            q2k_idx, q2k_num = map_to_index(phys_map)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        qb = _bhsd(q, bshd)
        lse = torch.empty(qb.shape[:3], dtype=torch.float32, device=q.device)
        with _Serialised(q.device):
            block_sparse_attn_fwd(qb, _bhsd(k, bshd), _bhsd(v, bshd), q2k_idx, q2k_num, phys_sizes,
                                  _bhsd(out, bshd), lse, sm_scale=sm_scale, q_block=q_tile, kv_block=kv_tile,
                                  config=config)
        return out, lse

    def backward(self, q, k, v, out, dout, lse, sparsity, kv_block_sizes, *, block_size: int, bshd: bool,
                 sm_scale: float, kv_padding_zero: bool = False, config: Optional[dict] = None):
        from ..kernels.triton.block_sparse_bwd import block_sparse_attn_bwd

        q_tile, kv_tile = PHYSICAL_TILES[block_size]
        phys_map, phys_sizes = physical_layout(BlockSparsity.of(sparsity).block_map(), kv_block_sizes, block_size,
                                               q_tile, kv_tile)
        q2k_idx, q2k_num = map_to_index(phys_map)
        k2q_idx, k2q_num = map_to_index(phys_map.transpose(-2, -1))
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        with _Serialised(q.device):
            block_sparse_attn_bwd(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), _bhsd(out, bshd),
                                  _bhsd(dout, bshd), lse, q2k_idx, q2k_num, k2q_idx, k2q_num, phys_sizes,
                                  _bhsd(dq, bshd), _bhsd(dk, bshd), _bhsd(dv, bshd),
                                  sm_scale=sm_scale, q_block=q_tile, kv_block=kv_tile, config=config)
        return dq, dk, dv
