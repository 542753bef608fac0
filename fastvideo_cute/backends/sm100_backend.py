"""Our tcgen05 (sm_100) kernels for 64-token blocks: a forward with LSE
(:mod:`fastvideo_cute.adapters.cute_sm100_fwd`) and the backward chain
(:mod:`fastvideo_cute.adapters.cute_sm100_bwd`), serving ``block_sparse_attn`` (64) on
data-center Blackwell, where FA4's block sparsity cannot serve 64-token tiles.

UNVERIFIED ON HARDWARE: both compile for sm_100a with the SASS checked on CPU, but no
compute-capability 10.x GPU has run their tests. Until one has (and the adapters'
``VERIFIED_ON_HARDWARE`` flags are set), this backend is reachable only by name
(``FASTVIDEO_VSA_BACKEND=sm100``), which counts as the explicit opt-in, and the adapters warn;
``FASTVIDEO_VSA_CUTEDSL=1`` sends sm_100 64-token calls to Triton.
"""

from __future__ import annotations

import importlib.util
from typing import Tuple

import torch

from ..metadata import map_to_index
from ..routes import CallInfo

_BLOCK = 64


def verified_on_hardware() -> bool:
    from ..adapters import cute_sm100_fwd

    return bool(cute_sm100_fwd.VERIFIED_ON_HARDWARE)


def support(info: CallInfo) -> Tuple[bool, str]:
    from ..adapters import cute_sm100_bwd, cute_sm100_fwd

    if info.device_type != "cuda" or info.arch is None:
        return False, "needs CUDA tensors"
    caps = cute_sm100_bwd.MAIN_CAPABILITIES if info.need_grad else cute_sm100_fwd.SUPPORTED_CAPABILITIES
    if tuple(info.arch) not in caps:
        which = "backward" if info.need_grad else "forward"
        return False, (f"the tcgen05 {which} targets compute capability "
                       f"{', '.join(f'{a}.{b}' for a, b in caps)}, not {info.arch[0]}.{info.arch[1]}")
    if info.block_size != _BLOCK:
        return False, f"64-token blocks only, got {info.block_size}"
    if info.dtype != torch.bfloat16:
        return False, f"bfloat16 only, got {info.dtype}"
    if info.head_dim != cute_sm100_fwd.HEAD_DIM:
        return False, f"head_dim {cute_sm100_fwd.HEAD_DIM} only, got {info.head_dim}"
    if info.q_len != info.kv_len:
        return False, f"q_len == kv_len only, got {info.q_len} and {info.kv_len}"
    blocks = info.q_len // _BLOCK
    if info.need_grad and blocks % 2:
        return False, f"the backward needs an even number of 64-token blocks (it works on 128-token pairs), got {blocks}"
    if not cute_sm100_fwd.sm100_fwd64_within_launch_limits(info.batch, info.heads, info.q_len, blocks, blocks):
        return False, "exceeds the kernels' launch limits"
    if importlib.util.find_spec("cutlass") is None:
        return False, "the CuTe DSL (nvidia-cutlass-dsl) is not installed (pip install 'fastvideo-cute[cute]')"
    return True, "ok"


def _bhsd(x: torch.Tensor, bshd: bool) -> torch.Tensor:
    return (x.transpose(1, 2) if bshd else x).contiguous()


def forward(q, k, v, block_map, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
            sm_scale: float):
    from ..adapters.cute_sm100_fwd import sm100_block_sparse_fwd64

    if abs(sm_scale - q.shape[-1] ** -0.5) > 1e-12:
        raise RuntimeError("sm100 backend: the kernels use softmax scale head_dim ** -0.5")
    q2k_idx, q2k_num = map_to_index(block_map)
    out, lse = sm100_block_sparse_fwd64(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), q2k_idx, q2k_num,
                                        kv_block_sizes)
    if bshd:
        out = out.transpose(1, 2).contiguous()
    return out, lse


def backward(q, k, v, out, dout, lse, block_map, kv_block_sizes, *, block_size: int, bshd: bool, sm_scale: float):
    from ..adapters.cute_sm100_bwd import sm100_block_sparse_bwd64

    k2q_idx, k2q_num = map_to_index(block_map.transpose(-2, -1))
    # Naming this backend (FASTVIDEO_VSA_BACKEND=sm100) is the explicit opt-in; the adapter warns.
    grads = sm100_block_sparse_bwd64(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), _bhsd(out, bshd),
                                     _bhsd(dout, bshd), lse.contiguous(), k2q_idx, k2q_num, kv_block_sizes,
                                     sm_scale=sm_scale, allow_unverified=True)
    if bshd:
        grads = tuple(g.transpose(1, 2).contiguous() for g in grads)
    return tuple(grads)
