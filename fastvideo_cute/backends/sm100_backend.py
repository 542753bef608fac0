"""Our tcgen05 (sm_100) kernels for 64-token blocks: a forward with LSE
(:mod:`fastvideo_cute.adapters.cute_sm100_fwd`) and the backward chain
(:mod:`fastvideo_cute.adapters.cute_sm100_bwd`), serving ``block_sparse_attn`` (64) on
data-center Blackwell, where FA4's block sparsity cannot serve 64-token tiles.

UNVERIFIED ON HARDWARE: both compile for sm_100a with the SASS checked on CPU, but no
compute-capability 10.x GPU has run their tests. Until one has (and the adapters'
``VERIFIED_ON_HARDWARE`` flags are set), ``verified_on`` answers False, so the router reaches
this backend only by name (``FASTVIDEO_VSA_BACKEND=sm100``, the explicit opt-in; the adapters
warn) and ``FASTVIDEO_VSA_CUTEDSL=1`` sends sm_100 64-token calls elsewhere.
"""

from __future__ import annotations

from typing import Dict

import torch

from ..call import CallInfo
from ..metadata import BlockSparsity
from .base import CompileKey, Verdict, basic_key, module_installed

__all__ = ["Sm100Backend"]

_BLOCK = 64


def _bhsd(x: torch.Tensor, bshd: bool) -> torch.Tensor:
    return (x.transpose(1, 2) if bshd else x).contiguous()


class Sm100Backend:
    name = "sm100"
    head_dims = (128,)

    def verified_on(self, arch) -> bool:
        from ..adapters import cute_sm100_fwd

        return bool(cute_sm100_fwd.VERIFIED_ON_HARDWARE) and arch is not None and tuple(arch)[0] == 10

    def support(self, call: CallInfo) -> Verdict:
        from ..adapters import cute_sm100_bwd, cute_sm100_fwd

        if call.device_type != "cuda" or call.arch is None:
            return False, "needs CUDA tensors"
        caps = cute_sm100_bwd.MAIN_CAPABILITIES if call.need_grad else cute_sm100_fwd.SUPPORTED_CAPABILITIES
        if tuple(call.arch) not in caps:
            which = "backward" if call.need_grad else "forward"
            return False, (f"the tcgen05 {which} targets compute capability "
                           f"{', '.join(f'{a}.{b}' for a, b in caps)}, not {call.arch[0]}.{call.arch[1]}")
        if call.block_size != _BLOCK:
            return False, f"64-token blocks only, got {call.block_size}"
        if call.dtype != torch.bfloat16:
            return False, f"bfloat16 only, got {call.dtype}"
        if call.head_dim != cute_sm100_fwd.HEAD_DIM:
            return False, f"head_dim {cute_sm100_fwd.HEAD_DIM} only, got {call.head_dim}"
        if call.q_len != call.kv_len:
            return False, f"q_len == kv_len only, got {call.q_len} and {call.kv_len}"
        blocks = call.q_len // _BLOCK
        if call.need_grad and blocks % 2:
            return False, f"the backward pairs kv blocks, so it needs an even number of 64-token blocks, got {blocks}"
        if not cute_sm100_fwd.sm100_fwd64_within_launch_limits(call.batch, call.heads, call.q_len, blocks, blocks):
            return False, "exceeds the kernels' launch limits"
        if not module_installed("cutlass"):
            return False, "the CuTe DSL is not installed (pip install 'fastvideo-cute[cute]')"
        return True, "ok"

    def compile_keys(self, call: CallInfo) -> Dict[str, CompileKey]:
        directions = ("fwd", "bwd") if call.need_grad else ("fwd",)
        return {d: basic_key(self.name, call, d, _BLOCK, (("tile", "64x64"),)) for d in directions}

    def forward(self, q, k, v, sparsity, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
                sm_scale: float, kv_padding_zero: bool = False):
        from ..adapters.cute_sm100_fwd import sm100_block_sparse_fwd64

        if abs(sm_scale - q.shape[-1] ** -0.5) > 1e-12:
            raise RuntimeError("sm100 backend: the kernels use softmax scale head_dim ** -0.5")
        q2k_idx, q2k_num = BlockSparsity.of(sparsity).q2k()
        out, lse = sm100_block_sparse_fwd64(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), q2k_idx, q2k_num,
                                            kv_block_sizes)
        if bshd:
            out = out.transpose(1, 2).contiguous()
        return out, lse

    def backward(self, q, k, v, out, dout, lse, sparsity, kv_block_sizes, *, block_size: int, bshd: bool,
                 sm_scale: float, kv_padding_zero: bool = False):
        from ..adapters.cute_sm100_bwd import sm100_block_sparse_bwd64

        k2q_idx, k2q_num = BlockSparsity.of(sparsity).k2q()
        # Naming this backend (FASTVIDEO_VSA_BACKEND=sm100) is the explicit opt-in; the adapter warns.
        grads = sm100_block_sparse_bwd64(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), _bhsd(out, bshd),
                                         _bhsd(dout, bshd), lse.contiguous(), k2q_idx, k2q_num, kv_block_sizes,
                                         sm_scale=sm_scale, allow_unverified=True)
        if bshd:
            grads = tuple(g.transpose(1, 2).contiguous() for g in grads)
        return tuple(grads)
