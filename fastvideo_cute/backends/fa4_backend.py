"""The CuTe route on FlashAttention-4: VSA block maps adapted into FA4 block sparsity
(:mod:`fastvideo_cute.adapters.fa4`). FA4 wants ``[B, S, H, D]``; BHSD callers are passed as
transposed views, and their output is written by FA4 straight into a contiguous BHSD tensor
through its transposed view (no copy: a ``.contiguous()`` after FA4's own BSHD output cost
128 us of a 1.2 ms forward at S=32768 on the H200). The backward's gradients are allocated the same
way, contiguous in the call layout, and written by FA4 through their BSHD views. Inputs arrive
validated, so this backend builds the metadata and calls FA4's kernels directly (the adapter's
checked entry points are for direct users)."""

from __future__ import annotations

from typing import Dict

import torch

from ..adapters.fa4 import (build_bwd_metadata, build_fwd_metadata, fa4_arch, fa4_block_sparse_bwd_prebuilt,
                            fa4_block_sparse_fwd_prebuilt, fa4_bwd_plan, fa4_fwd_plan, fa4_support,
                            fa4_version_problems, sm90_bwd_tile_m, zeroed_kv_padding)
from ..adapters.fa4_plan import FA4_HEAD_DIMS
from ..call import CallInfo
from ..metadata import BlockSparsity
from ..validation import has_partial_blocks
from .base import CompileKey, Verdict, basic_key, module_installed, stack_problems

__all__ = ["FA4Backend"]

_INSTALL = "pip install 'fastvideo-cute[cute]' (pins flash-attn-4==4.0.0b36)"


def _bshd_view(x: torch.Tensor, bshd: bool) -> torch.Tensor:
    return x if bshd else x.transpose(1, 2)


class FA4Backend:
    #: see CudnnBackend.zeroes_kv_padding
    zeroes_kv_padding = True
    name = "fa4"
    head_dims = FA4_HEAD_DIMS

    def verified_on(self, arch) -> bool:
        # Run on the H200 (tests/logs); the sm_100 plans are compile-verified only.
        return arch is not None and tuple(arch)[0] == 9

    def support(self, call: CallInfo) -> Verdict:
        if call.device_type != "cuda":
            return False, "FA4 needs CUDA tensors"
        ok, reason = fa4_support(call.arch, call.dtype, call.head_dim, call.block_size, call.block_size,
                                 call.need_grad)
        if not ok:
            return False, reason
        if not module_installed("flash_attn"):
            return False, f"flash-attn-4 is not installed ({_INSTALL})"
        problems = stack_problems(fa4_version_problems)
        if problems:
            return False, "CuTe stack version mismatch: " + "; ".join(map(str, problems)) + f" ({_INSTALL})"
        return True, "ok"

    def compile_keys(self, call: CallInfo) -> Dict[str, CompileKey]:
        keys = {}
        for direction in ("fwd", "bwd") if call.need_grad else ("fwd",):
            plan = (fa4_fwd_plan if direction == "fwd" else fa4_bwd_plan)(call.arch, call.block_size)
            tile = f"{plan.tile_mn[0]}x{plan.tile_mn[1]}" if plan.tile_mn else "fa4-default"
            if direction == "bwd" and call.arch[0] == 9:
                tile = f"{sm90_bwd_tile_m(call.head_dim, plan.q_sparse)}x{plan.kv_tile}"
            detail = (("tile", tile),
                      ("plan", f"q{plan.q_sparse}/kv{plan.kv_tile}" + ("/1stage" if plan.single_q_stage else "")),
                      # FA4 keys on "one q block" / "one kv block" (TVM stride specialization)
                      ("single_blocks", f"{call.q_len <= plan.q_sparse}/{call.kv_len <= plan.kv_tile}"))
            keys[direction] = basic_key(self.name, call, direction, call.block_size, detail)
        return keys

    def forward(self, q, k, v, sparsity, kv_block_sizes, *, block_size: int, bshd: bool, need_backward: bool,
                sm_scale: float, kv_padding_zero: bool = False):
        # Padded keys may hold anything (the contract says it never leaks); FA4 reads partial tiles
        # whole, so V's are zeroed out of place when any tile is partial (known from the cached
        # range check). All-full blocks skip the partial lists and the padding pass.
        del need_backward  # support() already checked the backward is servable
        partial = has_partial_blocks(kv_block_sizes, block_size)
        meta = build_fwd_metadata(BlockSparsity.of(sparsity).block_map(), kv_block_sizes, fa4_fwd_plan(fa4_arch(), block_size), not partial)
        qs, ks, vs = (_bshd_view(x, bshd) for x in (q, k, v))
        if partial and not kv_padding_zero:  # V alone: K's padding cannot leak (scores masked by select)
            _, vs = zeroed_kv_padding(None, vs, meta)
        out = None if bshd else q.new_empty(q.shape[:-1] + (v.shape[-1],))
        o, lse = fa4_block_sparse_fwd_prebuilt(qs, ks, vs, meta, softmax_scale=sm_scale,
                                               out=None if bshd else out.transpose(1, 2))
        return (o.contiguous() if bshd else out), lse

    def backward(self, q, k, v, out, dout, lse, sparsity, kv_block_sizes, *, block_size: int, bshd: bool,
                 sm_scale: float, kv_padding_zero: bool = False):
        partial = has_partial_blocks(kv_block_sizes, block_size)
        meta = build_bwd_metadata(BlockSparsity.of(sparsity).block_map(), kv_block_sizes, fa4_bwd_plan(fa4_arch(), block_size), not partial)
        qs, ks, vs, os_, dos = (_bshd_view(x, bshd) for x in (q, k, v, out, dout))
        if partial and not kv_padding_zero:
            ks, vs = zeroed_kv_padding(ks, vs, meta)
        # The gradients are allocated contiguous in the call layout and FA4 writes them through
        # their BSHD views: letting FA4 allocate them like K/V's padding-zeroed copies (contiguous
        # BSHD) cost two transposing copies, 303 of 5387 us (prof_route_h200_v3_grid_bwd.json).
        grads = tuple(torch.empty_like(x, memory_format=torch.contiguous_format) for x in (q, k, v))
        fa4_block_sparse_bwd_prebuilt(qs, ks, vs, os_, dos, lse, meta, softmax_scale=sm_scale,
                                      dq=_bshd_view(grads[0], bshd), dk=_bshd_view(grads[1], bshd),
                                      dv=_bshd_view(grads[2], bshd))
        return grads
