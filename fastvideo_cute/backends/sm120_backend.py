"""The CuTe route on GB10 / RTX Blackwell (sm_120/121): our own mma.sync + TMA forward
(:mod:`fastvideo_cute.adapters.cute_sm120`), 128-token tiles (256-token blocks as 2x2 tiles).

What it serves, and why no more (the library's contract is the reference, not the kernel's):
- inference only: the kernel has no backward, so grad-tracking calls go elsewhere;
- no LSE: it writes the output only, so it serves only calls whose LSE is discarded (the sparse
  branch of ``video_sparse_attn``); ``block_sparse_attn_*`` return an LSE and go elsewhere;
- every kv block full: the kernel also zeroes query rows past each block's size, which equals
  the library's contract (every query row attends) only when no block is partial;
- q_len == kv_len, bf16, head_dim 128, within the kernel's launch limits.
On sm_90 it runs too (verified on the H200) but is reachable by name only
(``FASTVIDEO_VSA_BACKEND=sm120``): faster backends serve sm_90.
"""

from __future__ import annotations

from typing import Dict

import torch

from ..call import CallInfo
from ..metadata import BlockSparsity, map_to_index, physical_layout
from .base import CompileKey, Verdict, basic_key, module_installed

__all__ = ["Sm120Backend"]

_TILE = 128


class Sm120Backend:
    name = "sm120"
    head_dims = (128,)

    def verified_on(self, arch) -> bool:
        # Verified on the H200 (sm_90); no sm_12x GPU has run it (compile-verified for sm_120a/121a).
        # It is the only CuTe kernel for sm_12x, so the router may still choose it there (see routes).
        return arch is not None and tuple(arch) == (9, 0)

    def support(self, call: CallInfo) -> Verdict:
        from ..adapters.cute_sm120 import HEAD_DIM, SUPPORTED_CAPABILITIES, sm120_within_launch_limits

        if call.device_type != "cuda" or call.arch is None:
            return False, "needs CUDA tensors"
        if tuple(call.arch) not in SUPPORTED_CAPABILITIES:
            return False, f"the mma.sync + TMA kernel targets sm_90/sm_120/sm_121, not sm_{call.arch[0]}{call.arch[1]}"
        if call.need_grad:
            return False, "inference only (the sm_120 kernel has no backward)"
        if call.need_lse:
            return False, "the sm_120 kernel returns no LSE (it serves video_sparse_attn's sparse branch)"
        if call.dtype != torch.bfloat16:
            return False, f"bfloat16 only, got {call.dtype}"
        if call.head_dim != HEAD_DIM:
            return False, f"head_dim {HEAD_DIM} only, got {call.head_dim}"
        if call.block_size not in (128, 256):
            return False, f"128- or 256-token blocks only, got {call.block_size}"
        if call.q_len != call.kv_len:
            return False, f"q_len == kv_len only, got {call.q_len} and {call.kv_len}"
        if not call.kv_all_full:
            return False, ("ragged variable_block_sizes: the kernel zeroes query rows past each block's size, "
                           "exact for the library's contract only when every block is full")
        blocks = call.kv_len // _TILE
        if not sm120_within_launch_limits(call.batch, call.heads, call.q_len, blocks, blocks):
            return False, "exceeds the kernel's launch limits (grid y, int32 TMA rows or list offsets)"
        if not module_installed("cutlass"):
            return False, "the CuTe DSL is not installed (pip install 'fastvideo-cute[cute]')"
        return True, "ok"

    def compile_keys(self, call: CallInfo) -> Dict[str, CompileKey]:
        from ..adapters.cute_sm120 import default_variant
        from ..kernels.cute.block_sparse_fwd128 import registry_name

        target = f"sm_{call.arch[0]}{call.arch[1]}a"
        detail = (("kernel", registry_name(default_variant(target))), ("tile", "128x128"), ("target", target))
        # 256-token blocks run as 2x2 128-token tiles: one compiled kernel for both block sizes.
        return {"fwd": basic_key(self.name, call, "fwd", _TILE, detail)}

    def forward(self, q, k, v, sparsity, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
                sm_scale: float, kv_padding_zero: bool = False):
        from ..adapters.cute_sm120 import sm120_block_sparse_fwd

        if need_backward:
            raise RuntimeError("sm120 backend: inference only")
        if abs(sm_scale - q.shape[-1] ** -0.5) > 1e-12:
            raise RuntimeError("sm120 backend: the kernel uses softmax scale head_dim ** -0.5")
        phys_map, phys_sizes = physical_layout(BlockSparsity.of(sparsity).block_map(), kv_block_sizes, block_size, _TILE, _TILE)
        q2k_idx, q2k_num = map_to_index(phys_map)
        qb, kb, vb = ((x.transpose(1, 2) if bshd else x).contiguous() for x in (q, k, v))
        out = sm120_block_sparse_fwd(qb, kb, vb, q2k_idx, q2k_num, phys_sizes)
        if bshd:
            out = out.transpose(1, 2).contiguous()
        # Not an LSE: this backend serves only calls that discard it (support() checks need_lse).
        lse = torch.full((qb.shape[0], qb.shape[1], qb.shape[2]), float("nan"), dtype=torch.float32, device=q.device)
        return out, lse

    def backward(self, *args, **kwargs):
        raise RuntimeError("sm120 backend: inference only (the router never sends it a backward)")
