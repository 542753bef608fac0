# SPDX-License-Identifier: Apache-2.0
"""Arch-independent stages of the VSA block-sparse backward, 64-token blocks (CuTe DSL).

Plain SIMT kernels (vectorized global loads/stores, warp shuffles; no TMA, no MMA), so the same
source compiles for sm_90a, sm_100a and sm_103a and is verified on the H200 while the tcgen05 main
kernel (``block_sparse_bwd64_sm100``) waits for an sm_100 GPU. Seed 000's launch chain is
preprocess -> work order -> main -> postprocess; this module holds the first and the last:

``BlockSparseBwd64Preprocess`` -- one CTA (256 threads) per 64-row block of ``[B*H*S, 128]``;
the CTA's block index is also the kv work item ``(b*H + h) * nb + kv`` (``S == 64 * nb``):
  - ``delta[r] = sum_d float(o[r, d]) * float(dO[r, d])`` (fp32, the bf16 o as given);
  - ``lse2[r] = lse[r] * log2(e)``, or ``+inf`` where ``lse[r] == -inf`` (a row with no valid
    key), so the main kernel's ``P = exp2(s * scale_log2 - lse2)`` is 0 there, never NaN;
  - ``dq_accum`` rows of the block zeroed (fp32; the main kernel reduce-adds into it);
  - if ``k2q_num[item] == 0`` (no q block selected kv block ``kv``): the block's dk and dv rows
    written as exact zeros (the main kernel skips the item; the outputs are ``empty_like``).

``BlockSparseBwd64Postprocess`` -- one CTA (256 threads) per 64-row block:
``dq = bf16(dq_accum * sm_scale)``, rows with ``lse == -inf`` exactly 0 whatever ``dq_accum`` holds.

``BlockSparseBwd64PostprocessFrag`` -- the same for a ``dq_accum`` whose 64-row tiles hold the
Hopper warp-specialized kernel's dQ accumulator in register order (its ``flat_dq``): one CTA of 128
threads per tile, thread ``t`` reads floats ``512 i + 4 t .. + 3`` (i < 16; coalesced 128-bit loads),
which are dQ's rows ``16 (t // 32) + t % 32 // 4 (+ 8)``, columns ``8 i + 2 (t % 4) (+ 1)``.

The Q^T / dO^T copies of seed 000's CUDA preprocess are not produced: tcgen05 reads MN-major
bf16 operands from shared memory, so the CuTe DSL main kernel takes Q and dO in their natural
layout (as FA4's sm100 backward does) and the two transposed copies (2 x B*H*S*128 bf16 of
traffic and workspace) are not needed.

Tensors are passed as 2-D row views (torch side: ``t.view(-1, 128)``), 1-D for the per-row and
per-item vectors; every size is dynamic, so one compiled object serves every shape. Shapes and
launch limits: ``limits.py``.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32

from fastvideo_cute.jit import CuteKernel, fake_matrix, fake_stream, fake_vector

from .limits import BLOCK, HEAD_DIM

NUM_THREADS = 256
LOG2E = math.log2(math.e)


def _tiled_copy_2d(dtype, threads_per_row: int, num_threads: int, elems: int) -> cute.TiledCopy:
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dtype, num_bits_per_copy=elems * dtype.width)
    thr_layout = cute.make_ordered_layout((num_threads // threads_per_row, threads_per_row), order=(1, 0))
    return cute.make_tiled_copy_tv(atom, thr_layout, cute.make_layout((1, elems)))


class BlockSparseBwd64Preprocess(CuteKernel):
    """delta, lse2, dq_accum zeroing, dk/dv zero rows of unselected kv blocks (see the module).
    Called (compiled) as ``fn(o2d, do2d, lse1d, delta1d, lse2_1d, dqacc2d, dk2d, dv2d, k2q_num1d)``.
    ``zero_dq=False``: dq_accum is left untouched (a chain that sums dQ elsewhere: the Hopper split
    backward)."""

    name = "block_sparse_bwd64_preprocess"

    def __init__(self, zero_dq: bool = True):
        self.zero_dq = bool(zero_dq)
        self.dtype = cutlass.BFloat16
        self.num_threads = NUM_THREADS
        # bf16 tiles: 16 threads x 8 elements (128-bit) per row, 16 rows a pass, 4 passes.
        self.bf16_threads_per_row = HEAD_DIM // 8
        # fp32 tiles: 32 threads x 4 elements (128-bit) per row, 8 rows a pass, 8 passes.
        self.f32_threads_per_row = HEAD_DIM // 4

    def config(self):
        return {} if self.zero_dq else {"zero_dq": False}

    @cute.jit
    def __call__(
        self,
        mO: cute.Tensor,  # [R, 128] bf16, R = B*H*S
        mdO: cute.Tensor,  # [R, 128] bf16
        mLSE: cute.Tensor,  # [R] fp32, natural log
        mDelta: cute.Tensor,  # [R] fp32 (out)
        mLSE2: cute.Tensor,  # [R] fp32 (out)
        mdQaccum: cute.Tensor,  # [R, 128] fp32 (out: zeroed)
        mdK: cute.Tensor,  # [R, 128] bf16 (out: zero rows of unselected kv blocks)
        mdV: cute.Tensor,  # [R, 128] bf16
        mK2QNum: cute.Tensor,  # [B*H*nb] int32
        stream: cuda.CUstream,
    ):
        copy_bf16 = _tiled_copy_2d(self.dtype, self.bf16_threads_per_row, self.num_threads, 8)
        copy_f32 = _tiled_copy_2d(Float32, self.f32_threads_per_row, self.num_threads, 4)
        num_blocks = cute.size(mK2QNum.shape[0])
        self.kernel(mO, mdO, mLSE, mDelta, mLSE2, mdQaccum, mdK, mdV, mK2QNum, copy_bf16, copy_f32).launch(
            grid=[num_blocks, 1, 1], block=[self.num_threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mO: cute.Tensor,
        mdO: cute.Tensor,
        mLSE: cute.Tensor,
        mDelta: cute.Tensor,
        mLSE2: cute.Tensor,
        mdQaccum: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        mK2QNum: cute.Tensor,
        copy_bf16: cute.TiledCopy,
        copy_f32: cute.TiledCopy,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        blk, _, _ = cute.arch.block_idx()
        tile = (BLOCK, HEAD_DIM)
        row0 = blk * BLOCK

        # ---- delta = rowsum(o * dO)
        thr_bf16 = copy_bf16.get_slice(tidx)
        tOgO = thr_bf16.partition_S(cute.local_tile(mO, tile, (blk, 0)))
        tOgdO = thr_bf16.partition_S(cute.local_tile(mdO, tile, (blk, 0)))
        tOcO = thr_bf16.partition_S(cute.make_identity_tensor(tile))
        tOrO = cute.make_rmem_tensor_like(tOgO)
        tOrdO = cute.make_rmem_tensor_like(tOgdO)
        cute.copy(copy_bf16, tOgO, tOrO)
        cute.copy(copy_bf16, tOgdO, tOrdO)
        prod = tOrO.load().to(Float32) * tOrdO.load().to(Float32)
        partial = prod.reduce(cute.ReductionOp.ADD, init_val=0.0, reduction_profile=(0, None, 1))
        sums = cute.make_rmem_tensor(cute.size(tOrO, mode=[1]), Float32)
        sums.store(partial)
        for m in cutlass.range_constexpr(cute.size(sums)):
            v = sums[m]
            for i in cutlass.range_constexpr(int(math.log2(self.bf16_threads_per_row))):
                v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << i)
            sums[m] = v
        if tOcO[0, 0, 0][1] == 0:
            for m in cutlass.range_constexpr(cute.size(sums)):
                mDelta[row0 + tOcO[0, m, 0][0]] = sums[m]

        # ---- lse2 (log2 domain, +inf for rows with no valid key)
        if tidx < BLOCK:
            lse = mLSE[row0 + tidx]
            lse2 = Float32.inf
            if lse != -Float32.inf:
                lse2 = lse * LOG2E
            mLSE2[row0 + tidx] = lse2

        # ---- dq_accum = 0
        if cutlass.const_expr(self.zero_dq):
            thr_f32 = copy_f32.get_slice(tidx)
            tQgQ = thr_f32.partition_D(cute.local_tile(mdQaccum, tile, (blk, 0)))
            zero_f32 = cute.make_rmem_tensor_like(tQgQ)
            zero_f32.fill(0.0)
            cute.copy(copy_f32, zero_f32, tQgQ)

        # ---- dk = dv = 0 on kv blocks no q block selected
        if mK2QNum[blk] == 0:
            tKgK = thr_bf16.partition_D(cute.local_tile(mdK, tile, (blk, 0)))
            tVgV = thr_bf16.partition_D(cute.local_tile(mdV, tile, (blk, 0)))
            zero_bf16 = cute.make_rmem_tensor_like(tKgK)
            zero_bf16.fill(0.0)
            cute.copy(copy_bf16, zero_bf16, tKgK)
            cute.copy(copy_bf16, zero_bf16, tVgV)

    # ------------------------------------------------------------------ compilation
    def fake_args(self) -> tuple:
        rows, items = cute.sym_int32(), cute.sym_int32()

        def rows_x_dim(dtype, align):
            return fake_matrix(dtype, rows, HEAD_DIM, align=align)

        def per_row():
            return fake_vector(Float32, rows, align=4)

        num = fake_vector(Int32, items, align=4)
        bf = self.dtype
        return (rows_x_dim(bf, 16), rows_x_dim(bf, 16), per_row(), per_row(), per_row(),
                rows_x_dim(Float32, 16), rows_x_dim(bf, 16), rows_x_dim(bf, 16), num, fake_stream())


class BlockSparseBwd64Postprocess(CuteKernel):
    """dq = bf16(dq_accum * sm_scale); rows with lse == -inf exactly 0 (see the module). Called
    (compiled) as ``fn(dqacc2d, lse1d, dq2d, sm_scale)``."""

    name = "block_sparse_bwd64_postprocess"

    def __init__(self):
        self.dtype = cutlass.BFloat16
        self.num_threads = NUM_THREADS
        self.threads_per_row = HEAD_DIM // 4  # 4 fp32 in (128-bit), 4 bf16 out (64-bit)

    def config(self):
        return {}

    @cute.jit
    def __call__(
        self,
        mdQaccum: cute.Tensor,  # [R, 128] fp32
        mLSE: cute.Tensor,  # [R] fp32, natural log
        mdQ: cute.Tensor,  # [R, 128] bf16 (out)
        sm_scale: Float32,
        stream: cuda.CUstream,
    ):
        copy_f32 = _tiled_copy_2d(Float32, self.threads_per_row, self.num_threads, 4)
        copy_bf16 = _tiled_copy_2d(self.dtype, self.threads_per_row, self.num_threads, 4)
        num_blocks = cute.ceil_div(cute.size(mLSE.shape[0]), BLOCK)
        self.kernel(mdQaccum, mLSE, mdQ, sm_scale, copy_f32, copy_bf16).launch(
            grid=[num_blocks, 1, 1], block=[self.num_threads, 1, 1], stream=stream
        )

    @cute.kernel
    def kernel(
        self,
        mdQaccum: cute.Tensor,
        mLSE: cute.Tensor,
        mdQ: cute.Tensor,
        sm_scale: Float32,
        copy_f32: cute.TiledCopy,
        copy_bf16: cute.TiledCopy,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        blk, _, _ = cute.arch.block_idx()
        tile = (BLOCK, HEAD_DIM)
        row0 = blk * BLOCK
        thr_f32 = copy_f32.get_slice(tidx)
        thr_bf16 = copy_bf16.get_slice(tidx)
        tAg = thr_f32.partition_S(cute.local_tile(mdQaccum, tile, (blk, 0)))
        tAc = thr_f32.partition_S(cute.make_identity_tensor(tile))
        tQg = thr_bf16.partition_D(cute.local_tile(mdQ, tile, (blk, 0)))
        tAr = cute.make_rmem_tensor_like(tAg)
        cute.copy(copy_f32, tAg, tAr)
        tQr = cute.make_rmem_tensor_like(tQg)
        tQr.store((tAr.load() * sm_scale).to(self.dtype))
        for m in cutlass.range_constexpr(cute.size(tQr, mode=[1])):
            if mLSE[row0 + tAc[0, m, 0][0]] == -Float32.inf:
                tQr[None, m, None].fill(0.0)
        cute.copy(copy_bf16, tQr, tQg)

    def fake_args(self) -> tuple:
        rows = cute.sym_int32()
        acc = fake_matrix(Float32, rows, HEAD_DIM, align=16)
        lse = fake_vector(Float32, rows, align=4)
        dq = fake_matrix(self.dtype, rows, HEAD_DIM, align=16)
        return (acc, lse, dq, Float32(1.0), fake_stream())


class BlockSparseBwd64PostprocessFrag(CuteKernel):
    """dq = bf16(dq_accum * sm_scale) from register-ordered dq_accum tiles (see the module); rows with
    lse == -inf exactly 0. Called (compiled) as ``fn(dqacc2d, lse1d, dq2d, sm_scale)``."""

    name = "block_sparse_bwd64_postprocess_frag"
    num_threads = 128  # one warpgroup's accumulator fragment

    def __init__(self):
        self.dtype = cutlass.BFloat16

    def config(self):
        return {}

    @cute.jit
    def __call__(self, mdQaccum: cute.Tensor, mLSE: cute.Tensor, mdQ: cute.Tensor, sm_scale: Float32,
                 stream: cuda.CUstream):
        num_blocks = cute.ceil_div(cute.size(mLSE.shape[0]), BLOCK)
        self.kernel(mdQaccum, mLSE, mdQ, sm_scale).launch(grid=[num_blocks, 1, 1], block=[self.num_threads, 1, 1],
                                                          stream=stream)

    @cute.kernel
    def kernel(self, mdQaccum: cute.Tensor, mLSE: cute.Tensor, mdQ: cute.Tensor, sm_scale: Float32):
        tidx, _, _ = cute.arch.thread_idx()
        blk, _, _ = cute.arch.block_idx()
        tile = BLOCK * HEAD_DIM
        src = cute.make_tensor(mdQaccum.iterator + cute.assume(blk * tile + tidx * 4, divby=4),
                               cute.make_layout((4, 16), stride=(1, 4 * self.num_threads)))
        acc = cute.make_rmem_tensor((4, 16), Float32)
        cute.autovec_copy(src, acc)
        lane = tidx % 32
        row0 = blk * BLOCK + (tidx // 32) * 16 + lane // 4
        col0 = (lane % 4) * 2
        for h in cutlass.range_constexpr(2):
            row = row0 + 8 * h
            out = cute.make_rmem_tensor((2, 16), self.dtype)
            for i in cutlass.range_constexpr(16):
                for e in cutlass.range_constexpr(2):
                    out[e, i] = self.dtype(acc[2 * h + e, i] * sm_scale)
            if mLSE[row] == -Float32.inf:
                out.fill(0.0)
            dst = cute.make_tensor(mdQ.iterator + cute.assume(row * HEAD_DIM + col0, divby=2),
                                   cute.make_layout((2, 16), stride=(1, 8)))
            cute.autovec_copy(out, dst)

    fake_args = BlockSparseBwd64Postprocess.fake_args  # the same arguments


def main_fake_args(dtype, io_align: int, tma_align: int) -> tuple:
    """The fake arguments of a main kernel (``block_sparse_bwd64_sm100`` / ``_sm90``): q, k, v, dO
    ``[R, 128]`` (``tma_align``-byte aligned: TMA sources), dk, dv (``io_align``), dq_accum fp32,
    lse2, delta ``[R]``, idx ``[items, max_q]``, num, order ``[items]``, vbs ``[nb]``, sm_scale, stream;
    every size dynamic."""
    rows, items, max_q, blocks = cute.sym_int32(), cute.sym_int32(), cute.sym_int32(), cute.sym_int32()
    tma = [fake_matrix(dtype, rows, HEAD_DIM, align=tma_align) for _ in range(4)]
    io = [fake_matrix(dtype, rows, HEAD_DIM, align=io_align) for _ in range(2)]
    per_row = [fake_vector(Float32, rows, align=4) for _ in range(2)]
    return (*tma, *io, fake_matrix(Float32, rows, HEAD_DIM, align=io_align), *per_row,
            fake_matrix(Int32, items, max_q, align=4), fake_vector(Int32, items, align=4),
            fake_vector(Int32, blocks, align=4), fake_vector(Int32, items, align=4), Float32(1.0), fake_stream())
