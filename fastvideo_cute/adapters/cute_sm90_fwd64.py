"""Host side of our sm_90a 64-token forward (``kernels/cute/block_sparse_fwd64/block_sparse_fwd64_sm90``).

Verified on the H200 (tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py over the default,
``q_regs=112``, eager-rescale and no-vote builds, the fused-gate epilogue included:
tests/logs/h200_2026-12-03_suites_vote_fe1b35c.log). Served by the ``sm90`` backend
(:mod:`fastvideo_cute.backends.sm90_backend`): the route table's sm_90 64-token forward and
128/256-token partial-tile forwards (1.06-1.10x cuDNN BSA's blk64 kernel with the lazy rescale and
its vote, ``benchmarks/results/fwd64_sm90_h200_v11.json``), and ``video_sparse_attn``'s gated inference calls,
where the fused gate also saves cuDNN's padding-zeroed V copy and the separate gate pass.

:func:`sm90_fwd64` takes the library's q2k lists (``q2k_idx`` int32 ``[B, H, Qb, W]``, first
``q2k_num`` entries selected, the rest never read; ``q2k_num`` int32 ``[B, H, Qb]``) and the kv
block sizes (int32 ``[KVb]``, or None when every block is full), already validated by the
library's checks, and returns ``(out, lse)``: out in the call layout (BHSD or BSHD, contiguous),
lse natural-log fp32 ``[B, H, S_q]``. Padded K/V rows may hold anything (NaN/Inf included): the
kernel masks them itself. :func:`sm90_fwd64_problems` says why a call cannot be served (None when
it can), without a GPU sync; :func:`tma_problem` is its per-tensor part (base alignment, strides),
also what a gate must pass.

Imports torch; the CuTe DSL only when a kernel is compiled.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Dict, Optional, Tuple

import torch

from ..jit import compile_kernel
from .kernel_layout import permutations

__all__ = ["sm90_fwd64_problems", "sm90_fwd64", "tma_problem", "HEAD_DIMS", "DTYPES"]

CAPABILITY = (9, 0)
BLOCK = 64
HEAD_DIMS = (64, 128)  # the kernel module's, repeated so the predicate never imports the CuTe DSL
DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
BASE_ALIGN = 128
STRIDE_ALIGN = 16

_COMPILED: Dict[tuple, Any] = {}


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> Tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device_index))


def sm90_fwd64_problems(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bshd: bool) -> Optional[str]:
    """None when :func:`sm90_fwd64` serves these tensors, else a one-line reason."""
    if not q.is_cuda:
        return "not a CUDA tensor"
    cc = _capability(q.get_device())
    if cc != CAPABILITY:
        return f"compute capability {cc[0]}.{cc[1]}: the kernel is sm_90a only"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q/k/v must share one dtype of {sorted(str(d) for d in DTYPES)}, got {q.dtype}/{k.dtype}/{v.dtype}"
    if q.dim() != 4 or k.shape != v.shape or q.shape[3] != k.shape[3]:
        return "q, k, v must be 4-D with k and v of one shape and one head_dim"
    if q.shape[3] not in HEAD_DIMS:
        return f"head_dim {q.shape[3]}: one of {HEAD_DIMS}"
    heads = (q.shape[2], k.shape[2]) if bshd else (q.shape[1], k.shape[1])
    if heads[0] != heads[1]:
        return f"{heads[0]} query heads and {heads[1]} kv heads: MHA only"
    sq = q.shape[1] if bshd else q.shape[2]
    if sq % BLOCK:
        return f"q_len {sq} is not a multiple of {BLOCK}"
    if q.numel() == 0 or k.numel() == 0:
        return "an empty tensor"
    for name, t in (("q", q), ("k", k), ("v", v)):
        problem = tma_problem(name, t)
        if problem is not None:
            return problem
    return None


def tma_problem(name: str, t: torch.Tensor) -> Optional[str]:
    """None when ``t``'s base and strides suit the kernel's TMA descriptors (q, k, v, the gate),
    else a one-line reason naming it. Fresh contiguous allocations always pass."""
    if t.data_ptr() % BASE_ALIGN:
        return f"{name}'s base address is not {BASE_ALIGN}-byte aligned (TMA)"
    if t.stride(-1) != 1:
        return f"{name} has a non-unit last stride {t.stride(-1)}"
    if any((st * t.element_size()) % STRIDE_ALIGN for st in t.stride()[:-1]):
        return f"{name} has an outer stride that is not a multiple of {STRIDE_ALIGN} bytes (TMA)"
    return None


def _kernel_fn(dtype: torch.dtype, head_dim: int, has_sizes: bool, fuse_gate: bool, variant: Tuple = ()):
    """``variant``: sorted ``(keyword, value)`` pairs of the kernel's configuration."""
    key = (dtype, head_dim, has_sizes, fuse_gate, variant)
    fn = _COMPILED.get(key)
    if fn is None:
        from ..kernels.cute.block_sparse_fwd64 import sm90_kernel

        kernel = sm90_kernel(DTYPES[dtype], head_dim, has_sizes, fuse_gate, **dict(variant))
        fn = _COMPILED[key] = compile_kernel(kernel, "sm_90a")[0]
    return fn


def sm90_fwd64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k_idx: torch.Tensor, q2k_num: torch.Tensor,
               block_sizes: Optional[torch.Tensor], *, bshd: bool, softmax_scale: Optional[float] = None,
               gate: Optional[torch.Tensor] = None,
               out_c: Optional[torch.Tensor] = None,
               variant: Optional[Dict[str, Any]] = None,
               out: Optional[torch.Tensor] = None,
               out_s: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Our sm_90a 64-token forward: ``(out, lse)`` (module docstring). The call must pass
    :func:`sm90_fwd64_problems`; the lists are int32 and contiguous.

    ``gate`` (q's shape, layout and dtype; 128-byte aligned) with ``out_c`` (``[B, H, Qb, D]``,
    q's dtype, unit last stride): the kernel's epilogue returns ``out_s + gate * out_c`` (out_c's
    row of each q tile broadcast over its rows; fp32, rounded once) instead of ``out_s``, the VSA
    gate composition without a pass of its own; the LSE stays the sparse branch's. Verified on the
    H200 (tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py::test_fused_gate_matches_reference).

    ``variant``: the kernel's configuration (``k_stages``, ``v_stages``, ``ctas_per_sm``,
    ``stmatrix_epilogue``, ``q_regs``, ``lazy_rescale``, ``lazy_vote`` of ``BlockSparseFwd64Sm90``), for the
    benchmarks' sweeps and the GPU tests; None is the kernel's default.

    ``out``: where the output goes (q's shape, dtype and layout, any strides that pass
    :func:`tma_problem`, e.g. a head slice of a bigger tensor); None allocates it.

    ``out_s`` (with ``gate``; the training forward, whose backward needs the sparse branch's own
    output): a tensor like ``out`` that also receives ``out_s`` (the kernel's ``store_out_s``: the
    same bits as the call without the gate returns), so the gate composition needs no pass of its
    own in training either."""
    if (gate is None) != (out_c is None):
        raise ValueError("gate and out_c are given together or not at all")
    if out_s is not None and gate is None:
        raise ValueError("sm90_fwd64: out_s is the sparse branch beside out_s + gate * out_c; it needs gate and out_c")
    for name, t in (("out", out), ("out_s", out_s)):  # checked before anything is compiled or launched
        if t is None:
            continue
        if t.shape != q.shape or t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"sm90_fwd64: {name} must have q's shape, dtype and device {tuple(q.shape)}, {q.dtype}, "
                             f"{q.device}; got {tuple(t.shape)}, {t.dtype}, {t.device}")
        problem = tma_problem(name, t)
        if problem is not None:
            raise ValueError(f"sm90_fwd64: {problem}")
    d = q.shape[3]
    variant = dict(variant or {})
    if out_s is not None:
        variant["store_out_s"] = True
    fn = _kernel_fn(q.dtype, d, block_sizes is not None, gate is not None, tuple(sorted(variant.items())))
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    b, h, sq, qko, vp = permutations(q.shape, bshd)  # -> (S, D, H, B) / (D, S, H, B)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    g = None if gate is None else gate.permute(qko)
    oc = None if out_c is None else out_c.permute(3, 2, 1, 0)  # [B, H, Qb, D] -> (D, Qb, H, B)
    os_ = None if out_s is None else out_s.permute(qko)
    fn(q.permute(qko), k.permute(qko), v.permute(vp), out.permute(qko), lse.permute(2, 1, 0),
       q2k_idx.permute(3, 2, 1, 0), q2k_num.permute(2, 1, 0), block_sizes, g, oc, os_, scale)
    return out, lse
