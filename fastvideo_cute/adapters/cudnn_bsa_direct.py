"""A direct TVM-FFI call of cuDNN-frontend's SM90 blk64 block-sparse forward kernel.

cuDNN's Python wrapper (``block_sparse_attention_forward`` -> ``bsa_attn_fwd`` ->
``_bsa_attn_fwd_sm90_blk64``, ``nvidia-cudnn-frontend==1.32.0``) costs about 0.5 ms of host time
per call: it validates, copies a rank-1 ``block_sizes`` to ``[B, H, KVb]``, wraps nine tensors
with ``from_dlpack``, builds a compile key, constructs the kernel object and calls the compiled
function through the CuTe DSL's non-FFI argument path. This module runs the *same kernel class*
(``BlockSparseAttnForwardSm90Blk64``, same constructor arguments) compiled once per static
configuration through :mod:`fastvideo_cute.jit` (``--enable-tvm-ffi``, in process and on disk),
and calls it with torch tensors.

Dataflow of :func:`cudnn_fwd_direct` (the hot path):

1. one dict lookup: the compiled function of ``(dtype, head_dim, value_dim, has_block_sizes,
   allow_empty)`` (compiled on first use: :class:`.cudnn_bsa_direct_kernel.CudnnFwdSm90Blk64`);
2. ``out`` allocated contiguous in the call layout and ``lse`` fp32 ``[B, H, S_q]`` (what cuDNN's
   wrapper allocates);
3. the permuted views cuDNN's kernel reads: q / k / out ``(S, D, H, B)``, v ``(D, S, H, B)``,
   lse ``(S, H, B)``, q2k index ``(W, Qb, H, B)``, q2k nums ``(Qb, H, B)`` (for BSHD the
   ``transpose(1, 2)`` and the permute fold into one permute of the call tensor);
4. the FFI call; the stream is the TVM-FFI environment's (the current torch stream of the
   tensors' device) and the DSL switches to the tensors' device when it differs.

``block_sizes`` stays rank 1: instead of cuDNN's per-call ``expand(B, H, -1).contiguous()`` copy,
the jitted ``__call__`` views it as ``(KVb, H, B)`` with strides ``(1, 0, 0)`` (a static layout, so
part of the compiled variant); the kernel reads ``sizes[n, h, b]`` at the same address. Without
block sizes, the q2k nums tensor fills the slot (and the split-offsets slot), as cuDNN does.

:func:`direct_fwd_problems` says whether the direct path serves a call (None) or why not (one
line); the adapter falls back to cuDNN's wrapper then. :func:`direct_problems` is the same
predicate on plain facts (:class:`DirectFacts`), testable without a GPU.
``FASTVIDEO_VSA_CUDNN_DIRECT=0`` switches the direct path off (read on every call).

Limits: SM90 (compute capability 9.0) only; blk64; ``kv_splits == 1`` (the wrapper's default,
what the adapter runs); fp16/bf16; head_dim 64/96/128; MHA; ``nvidia-cudnn-frontend`` exactly
1.32.0 (the kernel class's constructor and ``__call__`` signatures are version-specific); q/k/v
with a 128-byte aligned base (cuDNN's wrapper wraps them with ``assumed_align=128``; the TVM-FFI
entry checks it again and raises ValueError) and every outer stride a multiple of 16 bytes, size-1
modes included (each goes into a TMA descriptor; the adapter's ``_tma_ready`` skips size-1 modes,
so a call it passes may still fall back here).
Metadata is taken as :func:`.cudnn_bsa_metadata.build_cudnn_metadata` builds it (contiguous int32,
``block_sizes`` rank 1 or None) and not re-checked here, beyond what the TVM-FFI entry checks in C
(ranks, dtypes, unit leading strides, alignment, equal extents across tensors).

Imports torch; the CuTe DSL and cuDNN's kernel module only when a kernel is compiled.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
from typing import Any, Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from ..env import env_flag, env_str
from ..jit import compile_kernel
from .kernel_layout import permutations

__all__ = [
    "DIRECT_ENV",
    "DIRECT_CUDNN_VERSION",
    "DirectFacts",
    "direct_enabled",
    "direct_problems",
    "call_facts",
    "direct_fwd_problems",
    "direct_kernel",
    "cudnn_fwd_direct",
]

#: ``FASTVIDEO_VSA_CUDNN_DIRECT=0`` switches the direct path off (unset or 1: on).
DIRECT_ENV = "FASTVIDEO_VSA_CUDNN_DIRECT"
#: The one cuDNN-frontend version whose kernel class the direct path constructs.
DIRECT_CUDNN_VERSION = "1.32.0"
ARCH = "sm_90a"
CAPABILITY = (9, 0)
# the kernel module's constants, repeated here so that the predicate never imports the CuTe DSL
# (tests/adapters/test_cudnn_direct.py checks that they agree)
BLOCK = 64
HEAD_DIMS = (64, 96, 128)
DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
BASE_ALIGN = 128    # bytes: cuDNN's wrapper passes q/k/v/out with assumed_align=128
STRIDE_ALIGN = 16   # bytes: TMA's rule for every outer stride


@functools.lru_cache(maxsize=1)
def _cudnn_version() -> Optional[str]:
    try:
        return importlib.metadata.version("nvidia-cudnn-frontend")
    except importlib.metadata.PackageNotFoundError:
        return None


# ==============================================================================================
# The compiled kernels
# ==============================================================================================


def direct_kernel(dtype: torch.dtype, head_dim: int, value_dim: int, has_block_sizes: bool, allow_empty: bool):
    """The :class:`.cudnn_bsa_direct_kernel.CudnnFwdSm90Blk64` of one call's static facts (what a
    warm-up prebuilds: ``jit.compile_kernel(direct_kernel(...), "sm_90a")``). Imports the CuTe DSL
    and cuDNN's kernel module."""
    from .cudnn_bsa_direct_kernel import CudnnFwdSm90Blk64

    return CudnnFwdSm90Blk64(DTYPES[dtype], head_dim, value_dim, has_block_sizes=has_block_sizes,
                             allow_empty_block_nums=allow_empty, cudnn_version=_cudnn_version() or "none")


_COMPILED: Dict[tuple, Any] = {}


def _entry(compiled):
    """The positional ``tvm_ffi.Function`` under a freshly compiled object (which wraps it in a
    Python keyword-argument layer, one more frame per call); an object loaded from the disk cache
    already is one. The raw function keeps the compiled code alive."""
    raw = getattr(compiled, "__tvm_ffi_object__", None)
    execution_args = getattr(compiled, "execution_args", None)
    if raw is None or getattr(execution_args, "has_pointer_address_arg_specs", True):
        return compiled
    return raw() or compiled


def _compile(key: tuple):
    """Compile (or load from the jit caches) the variant of ``key`` and keep its entry in ``_COMPILED``."""
    fn = _entry(compile_kernel(direct_kernel(*key), ARCH)[0])
    _COMPILED[key] = fn
    return fn


# ==============================================================================================
# The predicate
# ==============================================================================================


class DirectFacts(NamedTuple):
    """What :func:`direct_problems` decides on (plain values: no tensors, no GPU)."""

    capability: Optional[Tuple[int, int]]  # None: not a CUDA tensor
    cudnn_version: Optional[str]           # installed nvidia-cudnn-frontend, None if absent
    dtype: torch.dtype
    head_dim: int
    value_dim: int
    heads_q: int
    heads_kv: int
    q_len: int
    sparse_block: int
    kv_splits: int
    empty: bool                            # some tensor has no element
    # q, k, v: (name, data_ptr, itemsize, shape, stride)
    layouts: Sequence[Tuple[str, int, int, Tuple[int, ...], Tuple[int, ...]]]


def _misaligned(name: str, ptr: int, itemsize: int, shape, stride) -> Optional[str]:
    if ptr % BASE_ALIGN:
        return f"{name}'s base address is not {BASE_ALIGN}-byte aligned (cuDNN's kernel assumes it)"
    if stride[-1] != 1:
        return f"{name} has a non-unit last stride {stride[-1]}"
    for st in stride[:-1]:  # size-1 modes too: their strides still go into the TMA descriptors
        if (st * itemsize) % STRIDE_ALIGN:
            return f"{name} has stride {st} (elements), not a multiple of {STRIDE_ALIGN} bytes (TMA)"
    return None


def direct_problems(f: DirectFacts) -> Optional[str]:
    """None when the direct path serves a call with these facts, else a one-line reason."""
    if f.capability is None:
        return "not a CUDA tensor"
    if tuple(f.capability) != CAPABILITY:
        return f"compute capability {f.capability[0]}.{f.capability[1]}: the direct path is SM90 only"
    if f.cudnn_version != DIRECT_CUDNN_VERSION:
        return (f"nvidia-cudnn-frontend {f.cudnn_version or 'not installed'}: the direct path constructs the "
                f"{DIRECT_CUDNN_VERSION} kernel class")
    if f.sparse_block != BLOCK:
        return f"sparse block {f.sparse_block}: the direct path is blk64 only"
    if f.kv_splits != 1:
        return f"kv_splits={f.kv_splits}: the direct path runs the non-split kernel only"
    if f.dtype not in DTYPES:
        return f"dtype {f.dtype}: fp16/bf16 only"
    if f.head_dim not in HEAD_DIMS or f.value_dim not in HEAD_DIMS:
        return f"head_dim {f.head_dim} / value_dim {f.value_dim}: each must be one of {HEAD_DIMS}"
    if f.heads_q != f.heads_kv:
        return f"{f.heads_q} query heads and {f.heads_kv} kv heads: MHA only"
    if f.q_len % BLOCK:
        return f"q_len {f.q_len} is not a multiple of {BLOCK}"
    if f.empty:
        return "an empty tensor"
    for layout in f.layouts:
        reason = _misaligned(*layout)
        if reason is not None:
            return reason
    return None


def direct_enabled() -> bool:
    """``$FASTVIDEO_VSA_CUDNN_DIRECT``: on when unset or empty, else parsed strictly (0 = off)."""
    return env_str(DIRECT_ENV) == "" or env_flag(DIRECT_ENV)


@functools.lru_cache(maxsize=None)
def _capability(device_index: int) -> Tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device_index))


def call_facts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bshd: bool, sparse_block: int,
               kv_splits: int = 1, capability: Optional[Tuple[int, int]] = None) -> DirectFacts:
    """The :class:`DirectFacts` of one call's tensors (metadata only: no GPU sync);
    ``capability``: the device's (None: not a CUDA tensor)."""
    sq, h = (q.shape[1], q.shape[2]) if bshd else (q.shape[2], q.shape[1])
    return DirectFacts(
        capability=capability,
        cudnn_version=_cudnn_version(),
        dtype=q.dtype,
        head_dim=q.shape[3],
        value_dim=v.shape[3],
        heads_q=h,
        heads_kv=k.shape[2] if bshd else k.shape[1],
        q_len=sq,
        sparse_block=sparse_block,
        kv_splits=kv_splits,
        empty=q.numel() == 0 or k.numel() == 0,
        layouts=[(name, t.data_ptr(), t.element_size(), tuple(t.shape), t.stride())
                 for name, t in (("q", q), ("k", k), ("v", v))],
    )


def direct_fwd_problems(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, bshd: bool, sparse_block: int,
                        kv_splits: int = 1) -> Optional[str]:
    """None when :func:`cudnn_fwd_direct` serves this forward, else a one-line reason. The tensors
    are the adapter's, already checked by it (4-D, one dtype and device, unit last stride, k and v
    of one shape); ``sparse_block``: the metadata's physical tile. No GPU sync."""
    if not direct_enabled():
        return f"switched off ({DIRECT_ENV}={env_str(DIRECT_ENV)})"
    dev = q.get_device()
    return direct_problems(call_facts(q, k, v, bshd=bshd, sparse_block=sparse_block, kv_splits=kv_splits,
                                      capability=_capability(dev) if dev >= 0 else None))


# ==============================================================================================
# The call
# ==============================================================================================


def cudnn_fwd_direct(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q2k_block_index: torch.Tensor,
                     q2k_block_nums: torch.Tensor, block_sizes: Optional[torch.Tensor], *, bshd: bool,
                     softmax_scale: Optional[float], allow_empty: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """cuDNN's SM90 blk64 forward, called directly: ``(out, lse)`` as cuDNN's wrapper returns them
    (out contiguous in the call layout, lse natural-log fp32 ``[B, H, S_q]``). The call must pass
    :func:`direct_fwd_problems`; the metadata is :func:`.cudnn_bsa_metadata.build_cudnn_metadata`'s
    (``q2k_block_nums`` present, ``block_sizes`` rank 1 or None)."""
    d, dv = q.shape[3], v.shape[3]
    key = (q.dtype, d, dv, block_sizes is not None, bool(allow_empty))
    fn = _COMPILED.get(key)
    if fn is None:
        fn = _compile(key)
    out = torch.empty((q.shape[0], q.shape[1], q.shape[2], dv), dtype=q.dtype, device=q.device)
    b, h, sq, qko, vp = permutations(q.shape, bshd)  # -> (S, D, H, B) / (D, S, H, B)
    lse = torch.empty((b, h, sq), dtype=torch.float32, device=q.device)
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)  # bsa_attn_fwd's default
    fn(q.permute(qko), k.permute(qko), v.permute(vp), out.permute(qko), lse.permute(2, 1, 0),
       q2k_block_index.permute(3, 2, 1, 0), q2k_block_nums.permute(2, 1, 0), block_sizes, scale)
    return out, lse
