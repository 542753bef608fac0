"""cuDNN-frontend's SM90 blk64 forward kernel class behind a TVM-FFI entry of our own.

:class:`CudnnFwdSm90Blk64` is a :class:`fastvideo_cute.jit.CuteKernel`: ``__init__`` stores the
static configuration, :meth:`~CudnnFwdSm90Blk64.fake_args` gives the layouts cuDNN's wrapper
(``_bsa_attn_fwd_sm90_blk64``, ``nvidia-cudnn-frontend==1.32.0``) hands its kernel for
``kv_splits=1``, and the ``@cute.jit`` ``__call__`` constructs cuDNN's
``BlockSparseAttnForwardSm90Blk64`` with the arguments the wrapper uses (blocksparse 64/64,
acc Float32, ``num_splits=1``) and calls it. So the kernel compiled is cuDNN's own; only the host
entry differs (TVM-FFI, compiled with ``--enable-tvm-ffi`` through ``jit.compile_kernel``).

Entry: ``(q, k, v, out, lse, q2k_index, q2k_nums, block_sizes, softmax_scale)`` plus the
environment stream, with q / k / out ``(S, D, H, B)`` (unit stride on D, 128-byte aligned),
v ``(D, S, H, B)`` (unit stride on D, 128-byte aligned), lse fp32 ``(S, H, B)``, q2k_index int32
``(W, Qb, H, B)``, q2k_nums int32 ``(Qb, H, B)`` (unit stride on the first mode for these three),
block_sizes int32 ``(KVb,)`` or None (``has_block_sizes=False``). Extents that must agree (B, H,
S_q, S_kv, Qb) share one symbol, so the entry checks them in C; every outer stride is dynamic.

``block_sizes`` stays rank 1: ``__call__`` views it as ``(KVb, H, B)`` with strides ``(1, 0, 0)``
(cuDNN's wrapper copies it to a contiguous ``[B, H, KVb]`` every call instead); the kernel reads
``sizes[n, h, b]`` from the same address either way. Without block sizes the nums tensor fills
that slot, and it fills the split-offsets slot (unused at ``num_splits=1``), as cuDNN does.

Imports the CuTe DSL and cuDNN's kernel module at import time: import it lazily (the host path,
:mod:`.cudnn_bsa_direct`, does). The class must not define ``__repr__``/``__str__`` (jit.py).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any, Mapping, Optional

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cudnn.block_sparse_attention.csrc.fwd.sm90_blk64.bsa_fwd_sm90 import BlockSparseAttnForwardSm90Blk64

from ..jit import CuteKernel, fake_stream

__all__ = ["CudnnFwdSm90Blk64", "BLOCK", "HEAD_DIMS", "DTYPE_NAMES", "BASE_ALIGN"]

BLOCK = 64
HEAD_DIMS = (64, 96, 128)
DTYPE_NAMES = ("float16", "bfloat16")
BASE_ALIGN = 128  # bytes: cuDNN's wrapper wraps q/k/v/out with assumed_align=128
_CUTE_DTYPES = {"float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 prefix of this file: its entry and layouts are baked into the compiled code, and the
    jit key's source fingerprint covers ``fastvideo_cute.kernels.cute`` and jit.py only."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


class CudnnFwdSm90Blk64(CuteKernel):
    """cuDNN's ``BlockSparseAttnForwardSm90Blk64`` behind a TVM-FFI entry (module docstring)."""

    name = "cudnn_fwd_sm90_blk64"

    def __init__(self, dtype: str, head_dim: int, value_dim: int, *, has_block_sizes: bool,
                 allow_empty_block_nums: bool, cudnn_version: str, gqa_ratio: int = 1):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {DTYPE_NAMES}, got {dtype!r}")
        for label, d in (("head_dim", head_dim), ("value_dim", value_dim)):
            if d not in HEAD_DIMS:
                raise ValueError(f"{label} must be one of {HEAD_DIMS}, got {d!r}")
        if not isinstance(gqa_ratio, int) or gqa_ratio < 1:
            raise ValueError(f"gqa_ratio must be an int >= 1, got {gqa_ratio!r}")
        self.dtype = dtype
        self.head_dim = int(head_dim)
        self.value_dim = int(value_dim)
        self.has_block_sizes = bool(has_block_sizes)
        self.allow_empty_block_nums = bool(allow_empty_block_nums)
        self.cudnn_version = str(cudnn_version)
        self.gqa_ratio = gqa_ratio

    def config(self) -> Mapping[str, Any]:
        return {
            "dtype": self.dtype,
            "head_dim": self.head_dim,
            "value_dim": self.value_dim,
            "gqa_ratio": self.gqa_ratio,
            "has_block_sizes": self.has_block_sizes,
            "allow_empty_block_nums": self.allow_empty_block_nums,
            "cudnn_version": self.cudnn_version,
            "entry_source": source_digest(),
        }

    def fake_args(self) -> tuple:
        """The layouts of the module docstring; head dims static (cuDNN's ``__call__`` re-imposes
        them from its configuration anyway), everything else dynamic."""
        dt = _CUTE_DTYPES[self.dtype]
        b, h, sq, skv, qb, width, kvb = (cute.sym_int32() for _ in range(7))
        hk = h if self.gqa_ratio == 1 else cute.sym_int32()

        def tensor(dtype, shape, unit: int, align: int):
            stride = tuple(1 if i == unit else cute.sym_int64() for i in range(len(shape)))
            return cute.runtime.make_fake_tensor(dtype, shape, stride=stride, assumed_align=align)

        q = tensor(dt, (sq, self.head_dim, h, b), 1, BASE_ALIGN)
        k = tensor(dt, (skv, self.head_dim, hk, b), 1, BASE_ALIGN)
        v = tensor(dt, (self.value_dim, skv, hk, b), 0, BASE_ALIGN)
        out = tensor(dt, (sq, self.value_dim, h, b), 1, BASE_ALIGN)
        lse = tensor(cutlass.Float32, (sq, h, b), 0, 4)
        idx = tensor(cutlass.Int32, (width, qb, h, b), 0, 4)
        nums = tensor(cutlass.Int32, (qb, h, b), 0, 4)
        sizes = tensor(cutlass.Int32, (kvb,), 0, 4) if self.has_block_sizes else None
        return (q, k, v, out, lse, idx, nums, sizes, cutlass.Float32(1.0), fake_stream())

    def _varblk(self, m_sizes, m_nums, m_q):
        """Trace-time Python: what fills cuDNN's ``blocksparse_varblk`` slot."""
        if not self.has_block_sizes:
            return m_nums
        layout = cute.make_layout((m_sizes.shape[0], m_q.shape[2], m_q.shape[3]), stride=(1, 0, 0))
        return cute.make_tensor(m_sizes.iterator, layout)

    def _cudnn_kernel(self) -> BlockSparseAttnForwardSm90Blk64:
        """The kernel object, constructed as ``_bsa_attn_fwd_sm90_blk64`` does for kv_splits=1."""
        return BlockSparseAttnForwardSm90Blk64(
            gqa_ratio=self.gqa_ratio,
            head_dim=self.head_dim,
            value_dim=self.value_dim,
            blocksparse_blocksize_q=BLOCK,
            blocksparse_blocksize_k=BLOCK,
            dtype=_CUTE_DTYPES[self.dtype],
            acc_dtype=cutlass.Float32,
            has_block_sizes=self.has_block_sizes,
            num_splits=1,
            allow_empty_block_nums=self.allow_empty_block_nums,
        )

    @cute.jit
    def __call__(self, m_q: cute.Tensor, m_k: cute.Tensor, m_v: cute.Tensor, m_o: cute.Tensor,
                 m_lse: cute.Tensor, m_idx: cute.Tensor, m_nums: cute.Tensor, m_sizes: Optional[cute.Tensor],
                 softmax_scale: cutlass.Float32, stream: cuda.CUstream):
        varblk = self._varblk(m_sizes, m_nums, m_q)
        # cuDNN's argument order; the split-offsets slot gets the nums tensor, as its wrapper passes it.
        self._cudnn_kernel()(m_q, m_k, m_v, m_o, m_lse, m_idx, m_nums, varblk, m_nums, softmax_scale, stream)
