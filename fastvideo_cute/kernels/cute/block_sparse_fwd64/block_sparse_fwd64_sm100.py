# SPDX-License-Identifier: Apache-2.0
"""VSA block-sparse attention forward, 64-token q and kv blocks, on tcgen05 + TMA (sm_100a).

What it computes, for BHSD bf16 q/k/v flattened to ``[B*H*S, 128]`` rows, ``S = T * 64``: for
query block ``i`` of head ``bh`` selecting ``num[bh*T+i]`` kv blocks ``idx[bh*T+i, 0:num)``
(``map_to_index`` layout; entries past the count are never read, indices outside ``[0, T)``
count as empty blocks), every row of the block (padding query rows included, as in the fp32
reference) is ``softmax(q K^T / sqrt(128)) V`` over the first ``vbs[j]`` keys of each selected
block ``j``, plus the natural-log LSE of that row. The library's LSE contract:

  - a row with no valid key (no selection, or only blocks of size 0) gets out exactly 0 and
    LSE ``-inf``;
  - keys at or past ``vbs[j]`` are masked by selection (scores replaced, never multiplied), and
    the V rows of those keys are zeroed in shared memory before ``P V`` (``0 * NaN`` is NaN), so
    padding K/V holding NaN/Inf never reaches a row;
  - a NaN in a valid query row gives a NaN output row and a NaN LSE (the sum is tested with
    ``l == 0``, not ``l > 0``).

How (correctness first; the simplest exact tcgen05 structure):
  - one CTA per (query block, batch*head), grid ``(T, B*H)``, three warps: warps 0-1 own the
    block's 64 query rows (one row per thread: TMEM lanes 0-63), warp 2 issues TMA and MMA;
  - the MMA tile is M = 128 (the cta_group::1 shape whose accumulator rows map one-to-one onto
    TMEM lanes): the Q tile is the block's 64 rows plus the next 64 rows of the flattened tensor
    (or TMA's zero fill past its end). Rows 64-127 of S, P and O are computed and never read,
    so every result row depends on its own Q row only;
  - K and V (64 x 128 each) arrive by TMA in a two-stage ring; the next selected block is
    loaded while the current one is computed;
  - S = Q K^T (tcgen05.mma, 128 x 64 x 128) into TMEM columns 0-63; the softmax threads load
    their row (tcgen05.ld 32x32b), mask, do the online softmax in registers, write P (bf16) to
    shared memory in the UMMA K-major layout; O_j = P V (tcgen05.mma, 128 x 128 x 64) into TMEM
    columns 128-255, loaded back and accumulated as ``O = O * alpha + O_j`` in registers;
  - the epilogue normalises and writes O (bf16) and the LSE (fp32) from registers;
  - the list walk, the masking and the softmax/LSE math are the shared ``common/walk.py`` and
    ``common/softmax.py``: arch-independent code that also builds for sm_90a, where the probe
    kernel (``softmax_probe.py``) runs it (so that part is testable on an H200).

Hand-offs (mbarriers): ``q``/``kv[2]`` (TMA transaction bytes), ``s`` and ``o`` (tcgen05.commit
after QK / PV), ``p`` (64 softmax-thread arrivals: P written, V padding zeroed, S read, the
previous O read). Every wait's parity is the block counter's, which both sides advance over the
same entries (those with valid keys), so a selection entry with 0 valid keys costs no load.

UNVERIFIED ON HARDWARE: compiled and SASS-checked on a CPU box only (no sm_100 GPU lent).

Shared memory: Q 32 KB + K 2 x 16 KB + V 2 x 16 KB + P 16 KB + barriers = 112 KB + 128 B
(two CTAs per SM); TMEM: 256 columns (two CTAs per SM). Shapes and launch limits: ``limits.py``.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass import Float32, Int32
from cutlass.cute.nvgpu import cpasync, tcgen05

from fastvideo_cute.jit import CuteKernel, fake_matrix, fake_stream, fake_vector

from ..common.softmax import finalize_row, mask_keys, online_softmax_update
from ..common.tcgen05 import fence_after, fence_before
from ..common.walk import list_entry, next_valid
from .limits import BLOCK, HEAD_DIM, KV_STAGES, MMA_M

TMEM_COLS = 256  # S: columns 0-63, O_j: columns 128-255
TMEM_O_OFFSET = 128


class BlockSparseFwd64Sm100(CuteKernel):
    """tcgen05 + TMA block-sparse forward with LSE, 64-token blocks (see the module docstring).
    Called (compiled) as ``fn(q2d, k2d, v2d, o2d, lse1d, idx2d, num1d, vbs1d)`` with torch tensors."""

    name = "block_sparse_fwd64_sm100"
    arch_family = "tcgen05+tma"

    def __init__(self):
        # QK, softmax, PV and the O accumulate strictly in turn per kv block (no configuration:
        # bf16, head_dim 128, 64-token blocks, two K/V stages).
        self.dtype = cutlass.BFloat16
        self.kv_stages = KV_STAGES
        self.num_softmax_warps = 2  # 64 rows, one per thread
        self.mma_warp = 2
        self.num_softmax_threads = 32 * self.num_softmax_warps
        self.num_threads = 32 * 3
        self.softmax_scale_log2 = (1.0 / math.sqrt(HEAD_DIM)) * math.log2(math.e)
        self.mma_tiler_qk = (MMA_M, BLOCK, HEAD_DIM)
        self.mma_tiler_pv = (MMA_M, HEAD_DIM, BLOCK)

    def config(self):
        return {}

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # [B*H*S, 128] bf16
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,  # [B*H*S, 128] bf16
        mLSE: cute.Tensor,  # [B*H*S] fp32
        mIdx: cute.Tensor,  # [B*H*T, max_kv] int32
        mNum: cute.Tensor,  # [B*H*T] int32
        mVbs: cute.Tensor,  # [T] int32
        stream: cuda.CUstream,
    ):
        cta_group = tcgen05.CtaGroup.ONE
        K_major = cute.nvgpu.OperandMajorMode.K
        MN_major = cute.nvgpu.OperandMajorMode.MN
        tiled_mma_qk = sm100_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, K_major, K_major, Float32, cta_group, self.mma_tiler_qk[:2]
        )
        tiled_mma_pv = sm100_utils.make_trivial_tiled_mma(
            self.dtype, self.dtype, K_major, MN_major, Float32, cta_group, self.mma_tiler_pv[:2]
        )
        sQ_layout = sm100_utils.make_smem_layout_a(tiled_mma_qk, self.mma_tiler_qk, self.dtype, 1)
        sK_layout = sm100_utils.make_smem_layout_b(tiled_mma_qk, self.mma_tiler_qk, self.dtype, self.kv_stages)
        sP_layout = sm100_utils.make_smem_layout_a(tiled_mma_pv, self.mma_tiler_pv, self.dtype, 1)
        sV_layout = sm100_utils.make_smem_layout_b(tiled_mma_pv, self.mma_tiler_pv, self.dtype, self.kv_stages)

        # V as the B operand of O = P V: (head_dim, keys), head_dim contiguous (MN-major).
        mVt = cute.make_tensor(mV.iterator, cute.select(mV.layout, mode=[1, 0]))

        g2s = cpasync.CopyBulkTensorTileG2SOp(cta_group)
        tma_atom_Q, tma_Q = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, mQ, cute.slice_(sQ_layout, (None, None, None, 0)), self.mma_tiler_qk, tiled_mma_qk
        )
        tma_atom_K, tma_K = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, mK, cute.slice_(sK_layout, (None, None, None, 0)), self.mma_tiler_qk, tiled_mma_qk
        )
        tma_atom_V, tma_V = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, mVt, cute.slice_(sV_layout, (None, None, None, 0)), self.mma_tiler_pv, tiled_mma_pv
        )
        self.q_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sQ_layout, (None, None, None, 0)))
        self.kv_bytes = cute.size_in_bytes(self.dtype, cute.slice_(sK_layout, (None, None, None, 0))) + \
            cute.size_in_bytes(self.dtype, cute.slice_(sV_layout, (None, None, None, 0)))

        stages = self.kv_stages

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 1]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, stages]
            mbar_s: cute.struct.MemRange[cutlass.Int64, 1]
            mbar_p: cute.struct.MemRange[cutlass.Int64, 1]
            mbar_o: cute.struct.MemRange[cutlass.Int64, 1]
            tmem_holding_buf: Int32
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sP_layout)], 1024]

        tiles = cute.size(mVbs.shape[0])
        batch_heads = cute.size(mNum.shape[0]) // tiles
        self.kernel(
            tiled_mma_qk, tiled_mma_pv, tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V,
            mO, mLSE, mIdx, mNum, mVbs, sQ_layout, sK_layout, sP_layout, sV_layout, SharedStorage,
        ).launch(
            grid=(tiles, batch_heads, 1),
            block=(self.num_threads, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tiled_mma_qk: cute.TiledMma,
        tiled_mma_pv: cute.TiledMma,
        tma_atom_Q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_atom_K: cute.CopyAtom,
        mK: cute.Tensor,
        tma_atom_V: cute.CopyAtom,
        mVt: cute.Tensor,
        mO: cute.Tensor,
        mLSE: cute.Tensor,
        mIdx: cute.Tensor,
        mNum: cute.Tensor,
        mVbs: cute.Tensor,
        sQ_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        sV_layout: cute.ComposedLayout,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        tile, bh, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        tiles = mVbs.shape[0]
        max_kv = mIdx.shape[1]
        query = bh * tiles + tile
        count = cutlass.min(cutlass.max(mNum[query], Int32(0)), max_kv)

        if warp_idx == self.mma_warp:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
        mbar_q = storage.mbar_q.data_ptr()
        mbar_kv = storage.mbar_kv.data_ptr()
        mbar_s = storage.mbar_s.data_ptr()
        mbar_p = storage.mbar_p.data_ptr()
        mbar_o = storage.mbar_o.data_ptr()

        if warp_idx == self.mma_warp:
            with cute.arch.elect_one():
                cute.arch.mbarrier_init(mbar_q, 1)
                for s in cutlass.range_constexpr(self.kv_stages):
                    cute.arch.mbarrier_init(mbar_kv + s, 1)
                cute.arch.mbarrier_init(mbar_s, 1)
                cute.arch.mbarrier_init(mbar_p, self.num_softmax_threads)
                cute.arch.mbarrier_init(mbar_o, 1)
            cute.arch.mbarrier_init_fence()
            # Tensor memory: the whole warp allocates; the address lands in shared memory.
            cute.arch.alloc_tmem(TMEM_COLS, storage.tmem_holding_buf)
            cute.arch.relinquish_tmem_alloc_permit()
        cute.arch.barrier()
        tmem_ptr = cute.arch.retrieve_tmem_ptr(Float32, 16, storage.tmem_holding_buf)

        thr_mma_qk = tiled_mma_qk.get_slice(0)
        thr_mma_pv = tiled_mma_pv.get_slice(0)
        tStS_fake = thr_mma_qk.make_fragment_C(thr_mma_qk.partition_shape_C(self.mma_tiler_qk[:2]))
        tStS = cute.make_tensor(tmem_ptr, tStS_fake.layout)
        tOtO_fake = thr_mma_pv.make_fragment_C(thr_mma_pv.partition_shape_C(self.mma_tiler_pv[:2]))
        tOtO = cute.make_tensor(tmem_ptr + TMEM_O_OFFSET, tOtO_fake.layout)

        if warp_idx == self.mma_warp:
            self.mma_warp_loop(tiled_mma_qk, tiled_mma_pv, thr_mma_qk, thr_mma_pv, tma_atom_Q, mQ,
                               tma_atom_K, mK, tma_atom_V, mVt, sQ, sK, sV, sP, tStS, tOtO,
                               mbar_q, mbar_kv, mbar_s, mbar_p, mbar_o, mIdx, mVbs, query, count, tiles)
        else:
            self.softmax_loop(thr_mma_qk, thr_mma_pv, tidx, sV, sP, tStS, tOtO, mbar_kv, mbar_s,
                              mbar_p, mbar_o, mO, mLSE, mIdx, mVbs, query, count, tiles)

        cute.arch.barrier()
        if warp_idx == self.mma_warp:
            cute.arch.dealloc_tmem(tmem_ptr, TMEM_COLS)

    @cute.jit
    def mma_warp_loop(self, tiled_mma_qk, tiled_mma_pv, thr_mma_qk, thr_mma_pv, tma_atom_Q, mQ,
                      tma_atom_K, mK, tma_atom_V, mVt, sQ, sK, sV, sP, tStS, tOtO,
                      mbar_q, mbar_kv, mbar_s, mbar_p, mbar_o, mIdx, mVbs, query, count, tiles):
        unit = cute.make_layout(1)
        # Q: the 128-row tile starting at the block's first row (rows 64-127 are discarded).
        gQ = cute.local_tile(cute.domain_offset((query * BLOCK, 0), mQ), (MMA_M, HEAD_DIM), (0, 0))
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, unit, cute.group_modes(sQ, 0, 3),
                                           cute.group_modes(thr_mma_qk.partition_A(gQ), 0, 3))
        gK = cute.local_tile(mK, (BLOCK, HEAD_DIM), (None, 0))  # (64, 128, blocks)
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, unit, cute.group_modes(sK, 0, 3),
                                           cute.group_modes(thr_mma_qk.partition_B(gK), 0, 3))
        gV = cute.local_tile(mVt, (HEAD_DIM, BLOCK), (0, None))  # (128, 64, blocks)
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, unit, cute.group_modes(sV, 0, 3),
                                           cute.group_modes(thr_mma_pv.partition_B(gV), 0, 3))

        tCrQ = tiled_mma_qk.make_fragment_A(sQ)
        tCrK = tiled_mma_qk.make_fragment_B(sK)
        tCrP = tiled_mma_pv.make_fragment_A(sP)
        tCrV = tiled_mma_pv.make_fragment_B(sV)
        head_block = (query // tiles) * tiles  # bh * T: the first kv block of this head

        e = next_valid(mIdx, mVbs, query, Int32(0), count, tiles, BLOCK)
        if e < count:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(mbar_q, self.q_bytes)
            cute.copy(tma_atom_Q, tQgQ, tQsQ[(None, 0)], tma_bar_ptr=mbar_q)
            kv_tile, _ = list_entry(mIdx, mVbs, query, e, tiles, BLOCK)
            self.load_kv(tma_atom_K, tma_atom_V, tKgK, tKsK, tVgV, tVsV, mbar_kv, head_block + kv_tile, 0)
            cute.arch.mbarrier_wait(mbar_q, 0)
        it = Int32(0)
        while e < count:
            stage = it % 2
            phase = (it // 2) % 2
            en = next_valid(mIdx, mVbs, query, e + 1, count, tiles, BLOCK)
            if en < count:
                # The other stage was read by the previous block's MMAs, which have completed.
                kv_next, _ = list_entry(mIdx, mVbs, query, en, tiles, BLOCK)
                self.load_kv(tma_atom_K, tma_atom_V, tKgK, tKsK, tVgV, tVsV, mbar_kv, head_block + kv_next,
                             1 - stage)
            cute.arch.mbarrier_wait(mbar_kv + stage, phase)
            # S = Q K^T
            for k in cutlass.range_constexpr(cute.size(tCrQ, mode=[2])):
                tiled_mma_qk.set(tcgen05.Field.ACCUMULATE, k != 0)
                cute.gemm(tiled_mma_qk, tStS, tCrQ[None, None, k, 0], tCrK[None, None, k, stage], tStS)
            with cute.arch.elect_one():
                tcgen05.commit(mbar_s)
            # P written (and V's padding rows zeroed) by the softmax threads.
            cute.arch.mbarrier_wait(mbar_p, it % 2)
            fence_after()
            # O_j = P V
            for k in cutlass.range_constexpr(cute.size(tCrP, mode=[2])):
                tiled_mma_pv.set(tcgen05.Field.ACCUMULATE, k != 0)
                cute.gemm(tiled_mma_pv, tOtO, tCrP[None, None, k, 0], tCrV[None, None, k, stage], tOtO)
            with cute.arch.elect_one():
                tcgen05.commit(mbar_o)
            cute.arch.mbarrier_wait(mbar_o, it % 2)
            e = en
            it = it + 1

    @cute.jit
    def load_kv(self, tma_atom_K, tma_atom_V, tKgK, tKsK, tVgV, tVsV, mbar_kv, block, stage):
        bar = mbar_kv + stage
        with cute.arch.elect_one():
            cute.arch.mbarrier_arrive_and_expect_tx(bar, self.kv_bytes)
        cute.copy(tma_atom_K, tKgK[(None, block)], tKsK[(None, stage)], tma_bar_ptr=bar)
        cute.copy(tma_atom_V, tVgV[(None, block)], tVsV[(None, stage)], tma_bar_ptr=bar)

    @cute.jit
    def softmax_loop(self, thr_mma_qk, thr_mma_pv, tidx, sV, sP, tStS, tOtO, mbar_kv, mbar_s,
                     mbar_p, mbar_o, mO, mLSE, mIdx, mVbs, query, count, tiles):
        # S: this thread's row of the 128 x 64 accumulator (32x32b: thread t <-> TMEM lane t).
        tSAcc = tStS[(None, None), 0, 0]
        tScS = thr_mma_qk.partition_C(cute.make_identity_tensor(self.mma_tiler_qk[:2]))[(None, None), 0, 0]
        s_load_atom = cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(BLOCK)), Float32)
        thr_s_load = tcgen05.make_tmem_copy(s_load_atom, tSAcc).get_slice(tidx)
        tStS_t2r = thr_s_load.partition_S(tSAcc)
        tScS_t2r = thr_s_load.partition_D(tScS)
        # O_j: 128 columns in 4 loads of 32.
        tOAcc = tOtO[(None, None), 0, 0]
        tOcO = thr_mma_pv.partition_C(cute.make_identity_tensor(self.mma_tiler_pv[:2]))[(None, None), 0, 0]
        o_load_atom = cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(32)), Float32)
        thr_o_load = tcgen05.make_tmem_copy(o_load_atom, tOAcc).get_slice(tidx)
        tOtO_t2r = thr_o_load.partition_S(tOAcc)
        tOcO_t2r = thr_o_load.partition_D(tOcO)

        acc_O = cute.make_rmem_tensor(tOcO_t2r.shape, Float32)
        acc_O.fill(0.0)
        rS = cute.make_rmem_tensor(tScS_t2r.shape, Float32)
        rP = cute.make_rmem_tensor(tScS_t2r.shape, self.dtype)
        rOj = cute.make_rmem_tensor(tOcO_t2r[None, None, 0].shape, Float32)  # one 32-column chunk
        row_max = -Float32.inf
        row_sum = Float32(0.0)
        scale_log2 = Float32(self.softmax_scale_log2)
        row = tScS_t2r[0][0]
        # P's buffer viewed as (rows, keys): the UMMA layout ((128, 16), 1, 4) : ((64, 1), 0, 16)
        # is offset m * 64 + k under the same swizzle, so rows are 64 contiguous (swizzled) keys.
        # The 32x32b load gives this thread the keys of its row in order (tScS_t2r: (row, i)).
        sP_mk = cute.make_tensor(sP.iterator, cute.make_layout((MMA_M, BLOCK), stride=(BLOCK, 1)))
        sP_row_chunks = cute.logical_divide(sP_mk[row, None], cute.make_layout(8))  # ((8), 8)
        rP_chunks = cute.logical_divide(rP, cute.make_layout(8))
        p_store_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=128)

        it = Int32(0)
        for e in cutlass.range(count, unroll=1):
            _, valid = list_entry(mIdx, mVbs, query, e, tiles, BLOCK)
            if valid > 0:
                stage = it % 2
                phase = (it // 2) % 2
                # ---- S row from TMEM; mask keys at or past the block's valid count (a select)
                cute.arch.mbarrier_wait(mbar_s, it % 2)
                fence_after()
                cute.copy(thr_s_load, tStS_t2r, rS)
                cute.arch.fence_view_async_tmem_load()
                if valid < BLOCK:
                    mask_keys(rS, tScS_t2r, valid)
                # ---- online softmax: one row per thread, no shuffles (common/softmax.py)
                p, row_max, row_sum, alpha = online_softmax_update(rS.load(), row_max, row_sum, scale_log2)
                rP.store(p.to(self.dtype))
                # ---- P -> shared memory (UMMA K-major, 128-byte swizzle), 16 bytes at a time
                for j in cutlass.range_constexpr(BLOCK // 8):
                    cute.copy(p_store_atom, rP_chunks[None, j], sP_row_chunks[None, j])
                # ---- V rows of padding keys -> 0 (P is 0 there, but 0 * NaN is NaN)
                if valid < BLOCK:
                    cute.arch.mbarrier_wait(mbar_kv + stage, phase)
                    for key in cutlass.range(valid, BLOCK, unroll=1):
                        for h in cutlass.range_constexpr(HEAD_DIM // self.num_softmax_threads):
                            d = tidx + h * self.num_softmax_threads
                            sV[((d, key % 16), 0, key // 16, stage)] = self.dtype(0.0)
                cute.arch.fence_view_async_shared()
                fence_before()  # this row's S load precedes the arrival
                cute.arch.mbarrier_arrive(mbar_p)
                # ---- O = O * alpha + P V
                cute.arch.mbarrier_wait(mbar_o, it % 2)
                fence_after()
                for c in cutlass.range_constexpr(cute.size(tOtO_t2r, mode=[2])):
                    cute.copy(thr_o_load, tOtO_t2r[None, None, c], rOj)
                    cute.arch.fence_view_async_tmem_load()
                    acc_c = acc_O[None, None, c]
                    acc_c.store(acc_c.load() * alpha + rOj.load())
                it = it + 1

        # ---- epilogue: normalise; rows without a valid key are 0 with LSE -inf
        inv, lse, empty = finalize_row(row_max, row_sum, scale_log2)
        grow = query * BLOCK + row
        mLSE[grow] = lse
        # This row of O, addressed in 64 bits (grow * 128 passes 2**31 past 16M rows).
        row_ptr = mO.iterator + cutlass.Int64(grow) * HEAD_DIM
        row_ptr = cute.make_ptr(self.dtype, row_ptr.toint(), cute.AddressSpace.gmem, assumed_align=16)
        gO_row = cute.make_tensor(row_ptr, cute.make_layout(HEAD_DIM))
        for i in cutlass.range_constexpr(cute.size(acc_O)):
            val = Float32(0.0) if empty else acc_O[i] * inv
            gO_row[tOcO_t2r[i][1]] = val.to(self.dtype)

    # ------------------------------------------------------------------ compilation
    def fake_args(self) -> tuple:
        """Fake (tensor-free) arguments of ``__call__``: dynamic row/block/list sizes."""
        rows = cute.sym_int32()
        bht, max_kv, tiles = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()

        def rows_x_dim():
            return fake_matrix(self.dtype, rows, HEAD_DIM, align=16)

        lse = fake_vector(Float32, rows, align=4)
        idx = fake_matrix(Int32, bht, max_kv, align=4)
        num = fake_vector(Int32, bht, align=4)
        vbs = fake_vector(Int32, tiles, align=4)
        return (rows_x_dim(), rows_x_dim(), rows_x_dim(), rows_x_dim(), lse, idx, num, vbs, fake_stream())
