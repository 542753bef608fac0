# SPDX-License-Identifier: Apache-2.0
"""The arch-independent part of the 64-token forward: key masking and the one-row-per-thread
online softmax with its LSE (CuTe DSL, no tcgen05, no TMA).

:mod:`.block_sparse_fwd64_sm100` calls these on the row a thread loads from tensor memory. They
use nothing Blackwell-specific, so they also build for sm_90a and run on any CUDA GPU:
:class:`SoftmaxRowProbe` is a tiny kernel that drives them over rows of scores held in global
memory, so the masking/softmax/LSE math (empty rows, NaN/Inf padding, NaN rows, the rescale)
is testable on an H200 while no sm_100 GPU is lent (tests/kernels/cute/
test_block_sparse_fwd64_gpu.py::test_softmax_math_probe_*; the CPU test compiles it for sm_90a).

Contract (per row, scores ``s`` of the valid keys of each selected block, in selection order):
``m = max s`` (NaN-ignoring), ``p = exp2((s - m) * scale_log2)``, ``l = sum p``,
``lse = (m * scale_log2 + log2 l) * ln 2`` (natural log of ``sum exp(s * scale)``);
``l == 0`` (no valid key) gives out 0 and LSE ``-inf``; a NaN score makes ``l`` NaN, so the
row's output and LSE are NaN (``l == 0`` is the test, never ``l > 0``).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

LN2 = math.log(2.0)
CHUNK = 64  # keys per kv block


@cute.jit
def mask_keys(rS: cute.Tensor, tScS: cute.Tensor, valid: Int32):
    """Scores of keys at or past ``valid`` -> -inf (a select: NaN/Inf scores there go too).
    ``tScS[i][1]`` is the key index (within the block) of ``rS[i]``."""
    for i in cutlass.range_constexpr(cute.size(rS)):
        if tScS[i][1] >= valid:
            rS[i] = -Float32.inf


@cute.jit
def online_softmax_update(srow: cute.TensorSSA, row_max: Float32, row_sum: Float32, scale_log2: Float32):
    """One block of a row: returns ``(p, new_max, new_sum, alpha)``; the caller rescales its
    accumulator by ``alpha`` before adding ``p @ V``."""
    cur_max = srow.reduce(cute.ReductionOp.MAX, row_max, 0)
    # A row whose scores are all -inf (or NaN) so far: exponents relative to 0.
    safe_max = Float32(0.0) if cur_max == -Float32.inf else cur_max
    p = cute.math.exp2(srow * scale_log2 - safe_max * scale_log2, fastmath=True)
    alpha = cute.math.exp2((row_max - safe_max) * scale_log2, fastmath=True)
    new_sum = row_sum * alpha + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
    return p, cur_max, new_sum, alpha


@cute.jit
def finalize_row(row_max: Float32, row_sum: Float32, scale_log2: Float32):
    """Returns ``(inv, lse, empty)``: the output scale ``1 / l``, the natural-log LSE, and
    whether the row had no valid key (then out is 0 and ``lse`` is -inf)."""
    empty = row_sum == Float32(0.0)  # a NaN sum (NaN query row) is kept: NaN out, NaN LSE
    inv = Float32(1.0) / (Float32(1.0) if empty else row_sum)
    safe_max = Float32(0.0) if row_max == -Float32.inf else row_max
    lse = (safe_max * scale_log2 + cute.math.log2(row_sum, fastmath=False)) * Float32(LN2)
    if empty:
        lse = -Float32.inf
    return inv, lse, empty


class SoftmaxRowProbe:
    """Drives the math above, one thread per row, over ``mS [rows, blocks * 64]`` fp32 scores
    (unscaled logits) and ``mVal`` (one fp32 value per key: the ``P V`` stand-in), with
    ``mValid [blocks]`` valid keys per block (blocks of 0 are skipped, as the kernel skips them).
    Writes ``mOut[r] = sum softmax * val`` (0 for rows without a valid key; padding values are
    zeroed by select, as the kernel zeroes V's padding rows) and ``mLSE[r]``."""

    def __init__(self, scale: float = 128 ** -0.5):
        self.scale_log2 = scale * math.log2(math.e)
        self.threads = 128

    @cute.jit
    def __call__(self, mS: cute.Tensor, mVal: cute.Tensor, mValid: cute.Tensor, mOut: cute.Tensor,
                 mLSE: cute.Tensor, stream: cuda.CUstream):
        rows = cute.size(mS.shape[0])
        self.kernel(mS, mVal, mValid, mOut, mLSE).launch(
            grid=((rows + self.threads - 1) // self.threads, 1, 1), block=(self.threads, 1, 1), stream=stream
        )

    @cute.kernel
    def kernel(self, mS: cute.Tensor, mVal: cute.Tensor, mValid: cute.Tensor, mOut: cute.Tensor,
               mLSE: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        r = bidx * self.threads + tidx
        rows = mS.shape[0]
        blocks = mValid.shape[0]
        if r < rows:
            coords = cute.make_identity_tensor((1, CHUNK))
            rS = cute.make_rmem_tensor((CHUNK,), Float32)
            rV = cute.make_rmem_tensor((CHUNK,), Float32)
            row_max = -Float32.inf
            row_sum = Float32(0.0)
            acc = Float32(0.0)
            scale_log2 = Float32(self.scale_log2)
            for b in cutlass.range(blocks, unroll=1):
                valid = cutlass.min(cutlass.max(mValid[b], Int32(0)), Int32(CHUNK))
                if valid > 0:
                    for i in cutlass.range_constexpr(CHUNK):
                        rS[i] = mS[r, b * CHUNK + i]
                        rV[i] = mVal[r, b * CHUNK + i]
                    mask_keys(rS, coords, valid)
                    for i in cutlass.range_constexpr(CHUNK):
                        if coords[i][1] >= valid:
                            rV[i] = Float32(0.0)
                    p, row_max, row_sum, alpha = online_softmax_update(rS.load(), row_max, row_sum, scale_log2)
                    acc = acc * alpha + (p * rV.load()).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
            inv, lse, empty = finalize_row(row_max, row_sum, scale_log2)
            mOut[r] = Float32(0.0) if empty else acc * inv
            mLSE[r] = lse

    def fake_args(self) -> tuple:
        rows, keys, blocks = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
        mat = lambda: cute.runtime.make_fake_compact_tensor(  # noqa: E731
            Float32, (rows, keys), stride_order=(1, 0), assumed_align=4)
        vec = lambda: cute.runtime.make_fake_compact_tensor(Float32, (rows,), assumed_align=4)  # noqa: E731
        valid = cute.runtime.make_fake_compact_tensor(Int32, (blocks,), assumed_align=4)
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return (mat(), mat(), valid, vec(), vec(), stream)

    def compile(self, arch: str | None = None, tvm_ffi: bool = True):
        """Called as ``fn(s2d, val2d, valid1d, out1d, lse1d)`` with torch fp32/int32 tensors."""
        options = []
        if tvm_ffi:
            options.append("--enable-tvm-ffi")
        if arch is not None:
            options.append(f"--gpu-arch {arch}")
        return cute.compile(self, *self.fake_args(), options=" ".join(options))
