"""Torch adapter for our CuTe DSL mma.sync + TMA block-sparse forward (128-token blocks).

The kernel (``fastvideo_cute/kernels/cute/block_sparse_fwd128``) is the GB10's (DGX Spark, sm_121a) VSA forward;
the same source compiles for sm_120a and runs on sm_90 (where it is verified; FA4's wgmma
kernels remain the fast route there). Inference only: it returns the output, no LSE, so it has no
backward; the router sends it no-grad calls only.

Contract of :func:`sm120_block_sparse_fwd` (seed 004's kernel contract):
  - q, k, v: ``[B, H, S, 128]`` bf16, contiguous (BHSD), ``S = T * 128``, one CUDA device;
  - q2k_idx ``[B, H, T, max_kv]`` and q2k_num ``[B, H, T]`` integer (``map_to_index`` layout:
    entries past a row's count are never read; counts are clamped to ``[0, max_kv]``; indices
    outside ``[0, T)`` count as empty tiles), kv_block_sizes ``[T]`` integer (clamped to
    ``[0, 128]``), the valid leading tokens of each block, for query rows and keys alike;
  - the output is written whole: rows at or past their block's size, and rows with no valid key
    (no selection, or only blocks of size 0), are exactly 0, so ``out`` needs no zero fill;
  - padding keys holding NaN/Inf never reach a valid row; a NaN in a valid query row gives a
    NaN output row; any T (odd included); deterministic (the phased walk depends only on the
    launch index, the counts and the SM count).

The launch limits (grid y, int32 TMA rows, int32 list offsets) are the kernel's own
(``block_sparse_fwd128/limits.py``), checked by :func:`sm120_fwd_support` before any launch. The
kernel compiles through :mod:`fastvideo_cute.jit` (in process; on disk under
``$FASTVIDEO_CUTE_CACHE_DIR`` when set).
"""

from __future__ import annotations

import functools
import os
from typing import Optional, Tuple

import torch

from fastvideo_cute.kernels.cute import block_sparse_fwd128 as _kernels  # names and limits only: no CuTe import
from fastvideo_cute.kernels.cute.block_sparse_fwd128.limits import BLOCK, CAPABILITIES, HEAD_DIM, LIMITS

from ._checks import LaunchLimits, check_list_forward, cute_dsl_importable, device_arch  # noqa: F401 (re-exported)

__all__ = [
    "BLOCK",
    "HEAD_DIM",
    "LIMITS",
    "SUPPORTED_CAPABILITIES",
    "sm120_arch",
    "sm120_within_launch_limits",
    "sm120_fwd_support",
    "sm120_block_sparse_fwd",
    "compiled_kernel",
    "VARIANTS",
    "default_variant",
]

# compute capability -> the arch string the kernel is compiled for (the kernel's table)
SUPPORTED_CAPABILITIES = CAPABILITIES


def sm120_arch(device: torch.device) -> Optional[str]:
    """The kernel's target arch for this device ("sm_121a", "sm_120a", "sm_90a"), else None."""
    return device_arch(device, SUPPORTED_CAPABILITIES)


def sm120_within_launch_limits(batch: int, heads: int, seq: int, num_blocks: int, max_kv: int) -> bool:
    """True iff one launch covers the call (the size-dependent part of the support predicate)."""
    return LIMITS.fits(batch, heads, seq, num_blocks, max_kv)


def sm120_fwd_support(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_idx: torch.Tensor,
    q2k_num: torch.Tensor,
    kv_block_sizes: torch.Tensor,
) -> Tuple[bool, str]:
    """``(True, "")`` iff :func:`sm120_block_sparse_fwd` can run these tensors here, else
    ``(False, reason)``. Static facts only (device, dtypes, shapes, layout, launch limits): it
    never reads tensor values, so it never synchronizes with the GPU."""
    return check_list_forward(q, k, v, q2k_idx, q2k_num, kv_block_sizes, head_dim=HEAD_DIM, block=BLOCK,
                              capabilities=SUPPORTED_CAPABILITIES, arch_hint="sm_90, sm_120 or sm_121",
                              limits=LIMITS)


# The kernel's modes (fastvideo_cute/kernels/cute/block_sparse_fwd128: Mode): "w4r3" (4 MMA warps of
# 32 rows that issue the loads in turn) and "simple_split" (8 MMA warps + a TMA producer warp). The
# other variants once measured are summarised in docs/architecture.md.
VARIANTS = _kernels.MODES
_VARIANT_ENV = "FASTVIDEO_CUTE_SM120_KERNEL"


# The variant per target arch, from benchmarks/results/vsa_h200_sm120.json: on the H200 "w4r3"
# (two 128-thread CTAs per SM, loads issued by the warps in turn, the walk read by lanes, branch-free
# P V on full chunks) measured fastest, 1.06-1.09x "w4i". The GB10's 99 KB of shared memory holds one 96 KB CTA per
# SM, where a 4-warp variant would run 4 warps per SM ("w4", one CTA per SM on the H200 too,
# measured slowest); so sm_12x runs the 8-warp "simple_split" (1.03-1.05x "simple" on the H200)
# until a GB10 measures otherwise.
DEFAULT_VARIANT_BY_ARCH = {"sm_90a": "w4r3", "sm_120a": "simple_split", "sm_121a": "simple_split"}


def default_variant(arch: Optional[str] = None) -> str:
    """``$FASTVIDEO_CUTE_SM120_KERNEL`` if set, else the measured choice for ``arch``."""
    fallback = DEFAULT_VARIANT_BY_ARCH.get(arch or "", "simple_split")
    variant = os.environ.get(_VARIANT_ENV, fallback) or fallback
    if variant not in VARIANTS:
        raise ValueError(f"{_VARIANT_ENV}={variant!r}: expected one of {VARIANTS}")
    return variant


def compiled_kernel(arch: str, variant: str):
    """The kernel compiled (TVM-FFI) for ``arch`` in mode ``variant``, through
    :mod:`fastvideo_cute.jit`: once per process, and from the disk cache when
    ``$FASTVIDEO_CUTE_CACHE_DIR`` is set (so a warmed container loads instead of compiling; the load
    path is exercised on CPU, a GPU launch of a loaded kernel is not yet verified). Shapes are
    dynamic: the key is the arch and the mode (bf16, head_dim 128 are fixed)."""
    return _kernels.kernel(variant).compile(arch)


@functools.lru_cache(maxsize=None)
def _num_sms(device_index: int) -> int:
    return max(1, torch.cuda.get_device_properties(device_index).multi_processor_count)


def sm120_block_sparse_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_idx: torch.Tensor,
    q2k_num: torch.Tensor,
    kv_block_sizes: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    variant: Optional[str] = None,
) -> torch.Tensor:
    """Block-sparse attention forward, 128-token blocks, inference only (see the module
    docstring). Returns ``out`` (``[B, H, S, 128]`` bf16, allocated if None; every element is
    written). Raises ``ValueError`` naming the reason when :func:`sm120_fwd_support` refuses.
    ``variant``: one of ``VARIANTS`` (default: :func:`default_variant` for this device's arch)."""
    variant = default_variant(sm120_arch(q.device)) if variant is None else variant
    if variant not in VARIANTS:
        raise ValueError(f"sm120_block_sparse_fwd: variant must be one of {VARIANTS}, got {variant!r}")
    ok, reason = sm120_fwd_support(q, k, v, q2k_idx, q2k_num, kv_block_sizes)
    if not ok:
        raise ValueError(f"sm120_block_sparse_fwd: {reason}")
    if out is None:
        out = torch.empty_like(q)
    elif (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous()
          or out.data_ptr() % 16 != 0):
        raise ValueError("sm120_block_sparse_fwd: out must be a contiguous, 16-byte aligned bf16 tensor of q's shape")
    if q.numel() == 0:
        return out
    batch, heads, seq, _ = q.shape
    blocks = kv_block_sizes.numel()
    rows = batch * heads * blocks
    idx = q2k_idx.to(torch.int32).reshape(rows, q2k_idx.shape[3])
    num = q2k_num.to(torch.int32).reshape(rows)
    if idx.shape[1] == 0:  # nothing can be selected: a one-column list the kernel never reads
        idx = torch.zeros((rows, 1), dtype=torch.int32, device=q.device)
        num = torch.zeros((rows,), dtype=torch.int32, device=q.device)
    idx, num = idx.contiguous(), num.contiguous()
    vbs = kv_block_sizes.to(torch.int32).contiguous()
    fn = compiled_kernel(sm120_arch(q.device), variant)
    with torch.cuda.device(q.device):
        fn(
            q.detach().view(-1, HEAD_DIM),
            k.detach().view(-1, HEAD_DIM),
            v.detach().view(-1, HEAD_DIM),
            out.detach().view(-1, HEAD_DIM),
            idx,
            num,
            vbs,
            _num_sms(q.device.index if q.device.index is not None else torch.cuda.current_device()),
        )
    return out
