# SPDX-License-Identifier: Apache-2.0
"""A probe of the 64-token forward's softmax math on any GPU: :class:`SoftmaxRowProbe` drives the
shared masking / online-softmax / LSE code (``common/softmax.py``, one row per thread, as
``block_sparse_fwd64_sm100`` calls it on the row a thread loads from tensor memory) over rows of
scores held in global memory. That code uses nothing Blackwell-specific, so the probe builds for
sm_90a and the math (empty rows, NaN/Inf padding, NaN rows, the rescale) is tested on an H200
while no sm_100 GPU is lent (tests/kernels/cute/test_block_sparse_fwd64_gpu.py::
test_softmax_math_probe_*; the CPU compile tests build it for sm_90a and sm_100a). The contract is
``common/softmax.py``'s.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from fastvideo_cute.jit import CuteKernel, fake_matrix, fake_stream, fake_vector

from ..common.softmax import finalize_row, mask_keys, online_softmax_update
from .limits import BLOCK as CHUNK  # keys per kv block


class SoftmaxRowProbe(CuteKernel):
    """Drives the shared softmax math, one thread per row, over ``mS [rows, blocks * 64]`` fp32 scores
    (unscaled logits) and ``mVal`` (one fp32 value per key: the ``P V`` stand-in), with
    ``mValid [blocks]`` valid keys per block (blocks of 0 are skipped, as the kernel skips them).
    Writes ``mOut[r] = sum softmax * val`` (0 for rows without a valid key; padding values are
    zeroed by select, as the kernel zeroes V's padding rows) and ``mLSE[r]``. Called (compiled)
    as ``fn(s2d, val2d, valid1d, out1d, lse1d)`` with torch fp32/int32 tensors."""

    name = "softmax_row_probe"

    def __init__(self, scale: float = 128 ** -0.5):
        self.scale = scale
        self.scale_log2 = scale * math.log2(math.e)
        self.threads = 128

    def config(self):
        return {"scale": self.scale}

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
        mat = lambda: fake_matrix(Float32, rows, keys, align=4)  # noqa: E731
        vec = lambda: fake_vector(Float32, rows, align=4)  # noqa: E731
        valid = fake_vector(Int32, blocks, align=4)
        return (mat(), mat(), valid, vec(), vec(), fake_stream())
