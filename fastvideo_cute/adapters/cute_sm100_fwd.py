"""Torch adapter for our CuTe DSL tcgen05 block-sparse forward, 64-token blocks (sm_100).

The kernel (``fastvideo_cute/kernels/cute/block_sparse_fwd64``) is the data-center Blackwell (sm_100a; its
source also builds for sm_103a) VSA forward for FastVideo's default 64-token tiles, which FA4's
block sparsity does not serve there. It returns the output and the LSE the backward consumes.

UNVERIFIED ON HARDWARE: it is compiled and its SASS checked on the CPU box; the parity tests
(tests/kernels/cute/test_block_sparse_fwd64_gpu.py) run on a compute-capability 10.x GPU only.
Until they have passed there, the router does not use it; calling it warns once.

Contract of :func:`sm100_block_sparse_fwd64` (the library's LSE contract):
  - q, k, v: ``[B, H, S, 128]`` bf16, contiguous (BHSD), ``S = T * 64``, one CUDA device;
  - q2k_idx ``[B, H, T, max_kv]`` and q2k_num ``[B, H, T]`` integer (``map_to_index`` layout:
    the first ``num`` entries of a row are its kv blocks; entries past the count are never read;
    counts are clamped to ``[0, max_kv]``; indices outside ``[0, T)`` count as empty blocks);
    kv_block_sizes ``[T]`` integer (clamped to ``[0, 64]``): keys at or past it are masked;
  - returns ``(out [B, H, S, 128] bf16, lse [B, H, S] fp32)``, LSE in natural log, scale
    ``128 ** -0.5``; every element of both is written. A row with no valid key is exactly 0 with
    LSE ``-inf``; padding K/V holding NaN/Inf never reach a row; a NaN in a query row gives a NaN
    output row and a NaN LSE. Query rows past their block's size are computed like any other
    (as in ``fastvideo_cute.reference``).

The launch limits (grid y, int32 TMA rows, int32 list offsets) are the kernel's own
(``block_sparse_fwd64/limits.py``), checked by :func:`sm100_fwd64_support` before any launch. The
kernel compiles through :mod:`fastvideo_cute.jit` (in process; on disk under
``$FASTVIDEO_CUTE_CACHE_DIR`` when set).
"""

from __future__ import annotations

import functools
import warnings
from typing import Optional, Tuple

import torch

from fastvideo_cute.kernels.cute import block_sparse_fwd64 as _kernels  # names and limits only: no CuTe import
from fastvideo_cute.kernels.cute.block_sparse_fwd64.limits import BLOCK, CAPABILITIES, HEAD_DIM, LIMITS

from ._checks import LaunchLimits, check_list_forward, cute_dsl_importable, device_arch  # noqa: F401 (re-exported)

__all__ = [
    "BLOCK",
    "HEAD_DIM",
    "LIMITS",
    "SUPPORTED_CAPABILITIES",
    "VERIFIED_ON_HARDWARE",
    "sm100_fwd64_arch",
    "sm100_fwd64_within_launch_limits",
    "sm100_fwd64_support",
    "sm100_block_sparse_fwd64",
    "compiled_kernel",
    "REGISTRY_NAME",
]

# compute capability -> the arch string the kernel is compiled for (the kernel's table)
SUPPORTED_CAPABILITIES = CAPABILITIES

#: Set to True (with the run recorded) once tests/kernels/cute/test_block_sparse_fwd64_gpu.py
#: has passed on a compute-capability 10.x GPU.
VERIFIED_ON_HARDWARE = False

#: the kernel's name in ``fastvideo_cute.kernels.cute.REGISTRY`` (compile_check, warm-up)
REGISTRY_NAME = _kernels.REGISTRY_NAME


def sm100_fwd64_arch(device: torch.device) -> Optional[str]:
    """The kernel's target arch for this device ("sm_100a", "sm_103a"), else None."""
    return device_arch(device, SUPPORTED_CAPABILITIES)


def sm100_fwd64_within_launch_limits(batch: int, heads: int, seq: int, num_blocks: int, max_kv: int) -> bool:
    """True iff one launch covers the call (the size-dependent part of the support predicate)."""
    return LIMITS.fits(batch, heads, seq, num_blocks, max_kv)


def sm100_fwd64_support(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_idx: torch.Tensor,
    q2k_num: torch.Tensor,
    kv_block_sizes: torch.Tensor,
) -> Tuple[bool, str]:
    """``(True, "")`` iff :func:`sm100_block_sparse_fwd64` can run these tensors here, else
    ``(False, reason)``. Static facts only (device, dtypes, shapes, layout, launch limits): it
    never reads tensor values, so it never synchronizes with the GPU."""
    return check_list_forward(q, k, v, q2k_idx, q2k_num, kv_block_sizes, head_dim=HEAD_DIM, block=BLOCK,
                              capabilities=SUPPORTED_CAPABILITIES,
                              arch_hint="sm_100 or sm_103 (compute capability 10.0/10.3)", limits=LIMITS)


def compiled_kernel(arch: str):
    """The kernel compiled (TVM-FFI) for ``arch``, through :mod:`fastvideo_cute.jit` (once per
    process; from the disk cache when ``$FASTVIDEO_CUTE_CACHE_DIR`` is set). Shapes are dynamic:
    the key is the arch (bf16, head_dim 128 and 64-token blocks are fixed)."""
    return _kernels.kernel().compile(arch)


@functools.lru_cache(maxsize=None)
def _warn_unverified() -> None:
    warnings.warn(
        "fastvideo_cute: the sm_100 CuTe DSL 64-token block-sparse forward is UNVERIFIED on hardware "
        "(compiled and SASS-checked only); run tests/kernels/cute/test_block_sparse_fwd64_gpu.py on a "
        "B200 before relying on it",
        RuntimeWarning,
        stacklevel=3,
    )


def sm100_block_sparse_fwd64(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_idx: torch.Tensor,
    q2k_num: torch.Tensor,
    kv_block_sizes: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    lse: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Block-sparse attention forward, 64-token blocks, with LSE (see the module docstring).
    Returns ``(out [B, H, S, 128] bf16, lse [B, H, S] fp32)`` (allocated if None; every element
    is written). Raises ``ValueError`` naming the reason when :func:`sm100_fwd64_support`
    refuses."""
    ok, reason = sm100_fwd64_support(q, k, v, q2k_idx, q2k_num, kv_block_sizes)
    if not ok:
        raise ValueError(f"sm100_block_sparse_fwd64: {reason}")
    if not VERIFIED_ON_HARDWARE:
        _warn_unverified()
    batch, heads, seq, _ = q.shape
    if out is None:
        out = torch.empty_like(q)
    elif (out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous()
          or out.data_ptr() % 16 != 0):
        raise ValueError("sm100_block_sparse_fwd64: out must be a contiguous, 16-byte aligned bf16 tensor of q's shape")
    if lse is None:
        lse = torch.empty((batch, heads, seq), dtype=torch.float32, device=q.device)
    elif (tuple(lse.shape) != (batch, heads, seq) or lse.dtype != torch.float32 or lse.device != q.device
          or not lse.is_contiguous()):
        raise ValueError("sm100_block_sparse_fwd64: lse must be a contiguous fp32 tensor [B, H, S]")
    if q.numel() == 0:
        return out, lse
    blocks = kv_block_sizes.numel()
    rows = batch * heads * blocks
    idx = q2k_idx.to(torch.int32).reshape(rows, q2k_idx.shape[3])
    num = q2k_num.to(torch.int32).reshape(rows)
    if idx.shape[1] == 0:  # nothing can be selected: a one-column list the kernel never reads
        idx = torch.zeros((rows, 1), dtype=torch.int32, device=q.device)
        num = torch.zeros((rows,), dtype=torch.int32, device=q.device)
    idx, num = idx.contiguous(), num.contiguous()
    vbs = kv_block_sizes.to(torch.int32).contiguous()
    fn = compiled_kernel(sm100_fwd64_arch(q.device))
    with torch.cuda.device(q.device):
        fn(
            q.detach().view(-1, HEAD_DIM),
            k.detach().view(-1, HEAD_DIM),
            v.detach().view(-1, HEAD_DIM),
            out.detach().view(-1, HEAD_DIM),
            lse.detach().view(-1),
            idx,
            num,
            vbs,
        )
    return out, lse
