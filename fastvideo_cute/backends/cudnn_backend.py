"""NVIDIA cuDNN-frontend block-sparse attention (``cudnn.block_sparse_attention``, CuTe-DSL
kernels) as a backend, through :mod:`fastvideo_cute.adapters.cudnn_bsa`.

cuDNN takes q2k lists as they are: lists that reached the op (``video_sparse_attn``'s top-k, the
index-native API) go straight in; a bool map becomes lists first (``map_to_index``: one fused
launch on a GPU); 256-token blocks run as 128-token tiles. Padding keys/values are made
harmless by one fused copy with the padding zeroed, only when some kv block is partial (V alone
for an inference forward, K and V when a backward follows; the backward copies again rather
than keeping two more K/V-sized tensors alive between the passes, unless told ``kv_padding_zero``:
by ``video_sparse_attn``'s compression pass, or by the eager forward's padding probe, see
:mod:`fastvideo_cute.padding_probe`). Installed with
``pip install 'fastvideo-cute[cudnn]'``; imported lazily.

Verified on the H200 (sm_90) when its GPU tests have passed there (``verified_on``); the
sm_100/sm_110/sm_120 paths are compile-checked only.
"""

from __future__ import annotations

from typing import Dict

from ..adapters.cudnn_bsa_support import cudnn_bwd_one_group, cudnn_support
from ..call import CallInfo
from ..metadata import BlockSparsity
from ..validation import has_partial_blocks
from .base import CompileKey, Verdict, basic_key, module_installed, stack_problems

__all__ = ["CudnnBackend"]

_INSTALL = "pip install 'fastvideo-cute[cudnn]' (pins nvidia-cudnn-frontend==1.32.0)"


class CudnnBackend:
    name = "cudnn"
    #: its kernels read partial kv tiles whole, so it copies K/V with their padding zeroed unless
    #: the caller passes ``kv_padding_zero=True`` (video_sparse_attn's compression pass made them)
    zeroes_kv_padding = True
    head_dims = (64, 96, 128)
    #: compute capabilities on which this backend's GPU tests have passed (tests/logs)
    VERIFIED = ((9, 0),)

    def verified_on(self, arch) -> bool:
        return arch is not None and tuple(arch) in self.VERIFIED

    def support(self, call: CallInfo) -> Verdict:
        if call.device_type != "cuda":
            return False, "cuDNN BSA needs CUDA tensors"
        ok, reason = cudnn_support(call.arch, call.dtype, call.head_dim, call.block_size, call.need_grad,
                                   q_len=call.q_len, kv_len=call.kv_len, heads_q=call.heads, heads_kv=call.heads,
                                   bshd=call.bshd, kv_all_full=call.kv_all_full)
        if not ok:
            return False, reason
        if not module_installed("cudnn"):
            return False, f"nvidia-cudnn-frontend is not installed ({_INSTALL})"
        from ..adapters.cudnn_bsa import cudnn_version_problems

        problems = stack_problems(cudnn_version_problems)
        if problems:
            return False, "cuDNN-frontend version mismatch: " + "; ".join(map(str, problems)) + f" ({_INSTALL})"
        return True, "ok"

    def compile_keys(self, call: CallInfo) -> Dict[str, CompileKey]:
        tile = 64 if call.block_size == 64 else 128
        detail = (("tile", f"{tile}x{tile}"), ("layout", "bshd" if call.bshd else "bhsd"),
                  ("ragged", str(not call.kv_all_full)))
        keys = {"fwd": basic_key(self.name, call, "fwd", call.block_size, detail)}
        if call.need_grad:  # one q group or several: cuDNN compiles a kernel variant for each (blk128)
            one = cudnn_bwd_one_group(call.arch, tile, call.q_len)
            keys["bwd"] = basic_key(self.name, call, "bwd", call.block_size,
                                    detail + (("q_groups", "1" if one else "several"),))
        return keys

    def forward(self, q, k, v, sparsity, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
                sm_scale: float, kv_padding_zero: bool = False):
        from ..adapters.cudnn_bsa import cudnn_block_sparse_fwd

        q2k_idx, q2k_num = BlockSparsity.of(sparsity).q2k()
        out, lse, _ = cudnn_block_sparse_fwd(q, k, v, q2k_idx, q2k_num, kv_block_sizes, block_size=block_size,
                                             bshd=bshd, softmax_scale=sm_scale,
                                             all_full=not has_partial_blocks(kv_block_sizes, block_size),
                                             need_backward=False, padding_finite=kv_padding_zero)
        return out, lse

    def backward(self, q, k, v, out, dout, lse, sparsity, kv_block_sizes, *, block_size: int, bshd: bool,
                 sm_scale: float, kv_padding_zero: bool = False):
        from ..adapters.cudnn_bsa import cudnn_block_sparse_bwd

        q2k_idx, q2k_num = BlockSparsity.of(sparsity).q2k()
        return cudnn_block_sparse_bwd(dout, q, k, v, out, lse, q2k_idx, q2k_num, kv_block_sizes,
                                      block_size=block_size, bshd=bshd, softmax_scale=sm_scale,
                                      all_full=not has_partial_blocks(kv_block_sizes, block_size),
                                      padding_finite=kv_padding_zero)
