# SPDX-License-Identifier: Apache-2.0
"""VSA block-sparse attention backward, 64-token blocks: the Hopper main kernel (wgmma + TMA, sm_90a).

Stage 3 of the chain (preprocess -> work order -> main -> postprocess, ``block_sparse_bwd64``), the
same contract and arguments as the tcgen05 kernel (``block_sparse_bwd64_sm100``) and the same
spec (``fastvideo_cute.adapters.cute_sm100_bwd.emulate_main``). One CTA per kv work item
``(b*H + h) * nb + kv`` (through the work order), one warpgroup (128 threads), two CTAs per SM;
K and V (64 x 128) stay in shared memory and the item's k2q list is walked one q block at a time
(Q and dO double-buffered by TMA, the next q block's load in flight during this one's MMAs):

    S^T  [kv 64 x q 64]   = K Q^T        wgmma SS (A = K  K-major, B = Q  K-major)
    dP^T [kv 64 x q 64]   = V dO^T       wgmma SS (A = V  K-major, B = dO K-major)
    P^T  = exp2(S^T * scale_log2 - lse2[q]),  keys >= size -> 0 (select)
    dS^T = P^T * (dP^T - delta[q]),           keys >= size -> 0 (select: dP^T is NaN there when V's
                                               padding is)
    dV   [kv 64 x hd 128] += P^T dO      wgmma RS (A = P^T bf16 registers, B = dO^T MN-major view)
    dK   [kv 64 x hd 128] += dS^T Q      wgmma RS (A = dS^T registers,     B = Q^T  MN-major view)
    dQ   [q 64 x hd 128]   = dS K        wgmma SS, two 64-column halves (A = dS K-major in shared
                                          memory, written transposed from dS^T's registers; B =
                                          K^T MN-major view)
    dq_accum[q rows] += dQ               ``dq_reduce="atomic"``: red.global.add.f32 per element;
                                          ``"bulk"``: staged in the step's Q/dO slots, two 16 KB
                                          cp.reduce.async.bulk; ``"flat"``: dQ as one 64 x 128 wgmma,
                                          staged in register order (``steps_flat``) and reduced the
                                          same way into register-order tiles (in no fixed order
                                          either way: dq is not bitwise run-to-run; dk, dv are)

K's padded rows are zeroed in shared memory once (dQ = dS K would give 0 * NaN); dk/dv rows of
padded keys are written as exact zeros; lse2 is +inf for rows without a key (the preprocess), so P
is 0 there. Items with an empty list are skipped (the preprocess zeroed their dk/dv rows). dk
carries sm_scale; dq gets it in the postprocess.

"atomic" and "bulk" are correctness-first: the MMAs of one step are serial (S and dP in flight
together, then dV and dK, then dQ). "flat" overlaps them (dV behind P^T, dQ with dK, the next q
block's load behind both) and is 1.6x faster (1.00-1.03x cuDNN's blk64 backward at 32,768 tokens, the
warp-specialized kernel stays ahead: docs/hopper-64-token.md); latency hiding comes from the two CTAs
per SM and the prefetched q block. Shapes and
launch limits: ``limits.py``; tensors as in ``block_sparse_bwd64_sm100`` (2-D row views).
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from quack import copy_utils as quack_copy
from quack import layout_utils

from fastvideo_cute.jit import CuteKernel

from ..common.bulk import bulk_copy_g2s, bulk_reduce_add_f32
from ..common.tma import tma_row_tiles
from ..common.wgmma import wgmma_gemm
from .block_sparse_bwd64_common import main_fake_args
from .pointwise import dscores_t, probs_t
from .limits import BLOCK, HEAD_DIM

__all__ = ["BlockSparseBwd64Sm90", "THREADS", "CTAS_PER_SM", "smem_bytes"]

THREADS = 128
CTAS_PER_SM = 2
Q_STAGES = 2
HALF = HEAD_DIM // 2  # dQ is computed in two column halves (64 accumulator registers, not 128)
LOG2E = math.log2(math.e)
#: how dQ reaches dq_accum: "bulk" (the default: the 64 x 128 fp32 tile staged in the step's Q and
#: dO slots, rows 0-31 and 32-63, once every MMA of the step has retired, and added by two
#: cp.reduce.async.bulk of 16 KB; 1.6x "atomic" on the H200, benchmarks/results/bwd64_sm90_h200_v2.json)
#: or "atomic" (red.global.add.f32 per element from registers), or "flat" (the step rebuilt around
#: what the warp-specialized kernel's measurements taught: dQ as one m64n128 wgmma issued with dK,
#: staged in its register order by 16 conflict-free 128-bit stores a thread into the step's Q and
#: dO slots and added by two 16 KB bulk reductions into a dq_accum tile of that order (the chain's
#: ``postprocess_frag`` un-permutes it); dS by stmatrix; dV issued before dP^T is waited for; lse2
#: and delta from shared memory; the next q block's load issued behind the step's dK/dQ; measured
#: 1.00x cuDNN's blk64 backward at 32,768 tokens and 0.96x on the Wan-1.3B grid against "bulk"'s 0.6x,
#: benchmarks/results/bwd64_sm90_h200_v22.json)
DQ_REDUCE = ("atomic", "bulk", "flat")


def smem_bytes() -> int:
    """K, V, the Q and dO rings (64 x 128 bf16 each) and dS (64 x 64 bf16), barriers, alignment."""
    tile = BLOCK * HEAD_DIM * 2
    return tile * (2 + 2 * Q_STAGES) + BLOCK * BLOCK * 2 + 8 * (1 + Q_STAGES) + 1024


class BlockSparseBwd64Sm90(CuteKernel):
    """wgmma main kernel of the 64-token VSA backward (module docstring; ``dq_reduce``: see
    ``DQ_REDUCE``). Called (compiled) as
    ``fn(q2d, k2d, v2d, do2d, dk2d, dv2d, dqacc2d, lse2, delta, idx2d, num, vbs, order, sm_scale)``."""

    name = "block_sparse_bwd64_sm90"

    def __init__(self, dq_reduce: str = "bulk", stats_in_smem: bool = False):
        if dq_reduce not in DQ_REDUCE:
            raise ValueError(f"dq_reduce must be one of {DQ_REDUCE}, got {dq_reduce!r}")
        self.dtype = cutlass.BFloat16
        self.dq_reduce = dq_reduce
        #: the q block's lse2 and delta (2 x 256 B) by bulk copy into shared memory with its Q/dO
        #: tiles, instead of 32 global loads per thread per step (9 % faster on the H200,
        #: bwd64_sm90_h200_v3.json; always on with dq_reduce="flat")
        self.stats_in_smem = bool(stats_in_smem) or dq_reduce == "flat"

    def config(self):
        return {"dq_reduce": self.dq_reduce, "stats_in_smem": self.stats_in_smem}

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, mdQaccum: cute.Tensor, mLSE2: cute.Tensor, mDelta: cute.Tensor,
                 mIdx: cute.Tensor, mNum: cute.Tensor, mVbs: cute.Tensor, mOrder: cute.Tensor,
                 sm_scale: Float32, stream: cuda.CUstream):
        bf = self.dtype
        k_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, bf)
        tile_layout = cute.tile_to_shape(k_atom, (BLOCK, HEAD_DIM), order=(0, 1))  # one 64 x 128 tile
        ring_layout = cute.tile_to_shape(k_atom, (BLOCK, HEAD_DIM, Q_STAGES), order=(0, 1, 2))
        ds_layout = cute.tile_to_shape(k_atom, (BLOCK, BLOCK), order=(0, 1))  # dS [q, kv], kv contiguous

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(g2s, mQ, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_dO, tma_dO = cpasync.make_tiled_tma_atom(g2s, mdO, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, tile_layout, (BLOCK, HEAD_DIM))

        K_MAJ, MN_MAJ = OperandMajorMode.K, OperandMajorMode.MN
        mma_s = sm90_helpers.make_trivial_tiled_mma(bf, bf, K_MAJ, K_MAJ, Float32, (1, 1, 1), tiler_mn=(BLOCK, BLOCK))
        mma_kv = sm90_helpers.make_trivial_tiled_mma(bf, bf, K_MAJ, MN_MAJ, Float32, (1, 1, 1),
                                                     tiler_mn=(BLOCK, HEAD_DIM), a_source=warpgroup.OperandSource.RMEM)
        dq_cols = HEAD_DIM if const_expr(self.dq_reduce == "flat") else HALF
        mma_dq = sm90_helpers.make_trivial_tiled_mma(bf, bf, K_MAJ, MN_MAJ, Float32, (1, 1, 1), tiler_mn=(BLOCK, dq_cols))

        stat_elems = 2 * BLOCK * Q_STAGES if const_expr(self.stats_in_smem) else 4

        @cute.struct
        class SharedStorage:
            bar_kv: cute.struct.MemRange[cutlass.Int64, 1]
            bar_q: cute.struct.MemRange[cutlass.Int64, Q_STAGES]
            sK: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(tile_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(tile_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ring_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ring_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ds_layout)], 1024]
            sStat: cute.struct.Align[cute.struct.MemRange[Float32, stat_elems], 128]  # lse2, delta per slot

        scale_log2 = sm_scale * Float32(LOG2E)
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V, tma_V,
            mdK, mdV, mdQaccum, mLSE2, mDelta, mIdx, mNum, mVbs, mOrder, sm_scale, scale_log2,
            mma_s, mma_kv, mma_dq, tile_layout, ring_layout, ds_layout, SharedStorage,
        ).launch(grid=(cute.size(mNum.shape[0]), 1, 1), block=(THREADS, 1, 1), smem=SharedStorage.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=CTAS_PER_SM, preferred_smem_carveout=100)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor, tma_atom_dO: cute.CopyAtom, mdO: cute.Tensor,
               tma_atom_K: cute.CopyAtom, mK: cute.Tensor, tma_atom_V: cute.CopyAtom, mV: cute.Tensor,
               mdK: cute.Tensor, mdV: cute.Tensor, mdQaccum: cute.Tensor, mLSE2: cute.Tensor, mDelta: cute.Tensor,
               mIdx: cute.Tensor, mNum: cute.Tensor, mVbs: cute.Tensor, mOrder: cute.Tensor,
               sm_scale: Float32, scale_log2: Float32,
               mma_s: cute.TiledMma, mma_kv: cute.TiledMma, mma_dq: cute.TiledMma,
               tile_layout: cute.ComposedLayout, ring_layout: cute.ComposedLayout, ds_layout: cute.ComposedLayout,
               SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        work, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        nb = cute.size(mVbs.shape[0])
        item = cute.arch.make_warp_uniform(mOrder[work])
        bh = item // nb
        kv = item - bh * nb
        count = cutlass.min(cutlass.max(mNum[item], Int32(0)), mIdx.shape[1])
        size = cutlass.min(cutlass.max(mVbs[kv], Int32(0)), Int32(BLOCK))

        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_dO, tma_atom_K, tma_atom_V):
                cpasync.prefetch_descriptor(atom)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        tma_op = pipeline.PipelineOp.TmaLoad
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        bar_kv = pipeline.MbarrierArray(storage.bar_kv.data_ptr(), num_stages=1, agent=(tma_op, one))
        bar_q = pipeline.MbarrierArray(storage.bar_q.data_ptr(), num_stages=Q_STAGES, agent=(tma_op, one))
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if count > 0:
            self.process(tma_atom_Q, mQ, tma_atom_dO, mdO, tma_atom_K, mK, tma_atom_V, mV, mdK, mdV, mdQaccum,
                         mLSE2, mDelta, mIdx, sm_scale, scale_log2, mma_s, mma_kv, mma_dq, tile_layout, ring_layout,
                         ds_layout, storage, bar_kv, bar_q, tidx, warp_idx, item, bh, kv, nb, count, size)

    @cute.jit
    def process(self, tma_atom_Q, mQ, tma_atom_dO, mdO, tma_atom_K, mK, tma_atom_V, mV, mdK, mdV, mdQaccum,
                mLSE2, mDelta, mIdx, sm_scale, scale_log2, mma_s, mma_kv, mma_dq, tile_layout, ring_layout,
                ds_layout, storage, bar_kv, bar_q, tidx, warp_idx, item, bh, kv, nb, count, size):
        bf = self.dtype
        tile_bytes = cute.size_in_bytes(bf, tile_layout)
        # ---- shared memory, and the transposed (MN-major) views of the same bytes
        sK = storage.sK.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sV = storage.sV.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sQ = storage.sQ.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdO = storage.sdO.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdS = storage.sdS.get_tensor(ds_layout.outer, swizzle=ds_layout.inner)
        sQt = layout_utils.transpose_view(sQ)  # (hd, q, stage)
        sdOt = layout_utils.transpose_view(sdO)
        sKt = layout_utils.transpose_view(sK)  # (hd, kv)
        sdSt = layout_utils.transpose_view(sdS)  # (kv, q)
        sStat = storage.sStat.get_tensor(cute.make_layout(2 * BLOCK * Q_STAGES if const_expr(self.stats_in_smem) else 4))
        stat_ptr = storage.sStat.data_ptr()

        # ---- TMA partitions (tiles of 64 rows of the [R, 128] row views)
        tQsQ, tQgQ = tma_row_tiles(tma_atom_Q, mQ, sQ, (BLOCK, HEAD_DIM))
        tOsO, tOgO = tma_row_tiles(tma_atom_dO, mdO, sdO, (BLOCK, HEAD_DIM))
        tKsK, tKgK = tma_row_tiles(tma_atom_K, mK, sK, (BLOCK, HEAD_DIM))
        tVsV, tVgV = tma_row_tiles(tma_atom_V, mV, sV, (BLOCK, HEAD_DIM))

        # ---- MMA fragments
        thr_s = mma_s.get_slice(tidx)
        thr_kv = mma_kv.get_slice(tidx)
        thr_dq = mma_dq.get_slice(tidx)
        tSrK = thr_s.make_fragment_A(thr_s.partition_A(sK))
        tSrQ = thr_s.make_fragment_B(thr_s.partition_B(sQ))  # (..., stage)
        tPrV = thr_s.make_fragment_A(thr_s.partition_A(sV))
        tPrdO = thr_s.make_fragment_B(thr_s.partition_B(sdO))
        tVrdOt = thr_kv.make_fragment_B(thr_kv.partition_B(sdOt))  # (..., stage)
        tKrQt = thr_kv.make_fragment_B(thr_kv.partition_B(sQt))
        tQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS))
        flat = const_expr(self.dq_reduce == "flat")
        if const_expr(flat):  # dQ as one 64 x 128 wgmma (B = K^T, MN-major)
            tQrKt0 = tQrKt1 = thr_dq.make_fragment_B(thr_dq.partition_B(sKt))
        else:
            tQrKt0 = thr_dq.make_fragment_B(thr_dq.partition_B(cute.local_tile(sKt, (HALF, BLOCK), (0, 0))))
            tQrKt1 = thr_dq.make_fragment_B(thr_dq.partition_B(cute.local_tile(sKt, (HALF, BLOCK), (1, 0))))

        acc_S = cute.make_rmem_tensor(thr_s.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_dP = cute.make_rmem_tensor(thr_s.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_dV = cute.make_rmem_tensor(thr_kv.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        acc_dK = cute.make_rmem_tensor(thr_kv.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C((BLOCK, HEAD_DIM if const_expr(flat) else HALF)),
                                       Float32)
        acc_dV.fill(0.0)
        acc_dK.fill(0.0)
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        acc_dP_mn = layout_utils.reshape_acc_to_mn(acc_dP)
        tScS_mn = layout_utils.reshape_acc_to_mn(thr_s.partition_C(cute.make_identity_tensor((BLOCK, BLOCK))))
        tP_view = layout_utils.reshape_acc_to_frgA(acc_S)
        tdS_view = layout_utils.reshape_acc_to_frgA(acc_dP)
        rP = cute.make_rmem_tensor_like(tP_view, bf)
        rdS = cute.make_rmem_tensor_like(tdS_view, bf)
        tSsdSt = thr_s.partition_C(sdSt)  # this thread's dS^T elements in the dS buffer
        num_cols = cute.size(acc_S_mn, mode=[1])
        lse2 = cute.make_rmem_tensor((num_cols,), Float32)
        delta = cute.make_rmem_tensor((num_cols,), Float32)

        # ---- K, V and the first q block; K's padded rows zeroed before any MMA reads them
        kv_rb = bh * nb + kv
        if warp_idx == 0:
            bar_kv.arrive_and_expect_tx(0, 2 * tile_bytes)
            cute.copy(tma_atom_K, tKgK[None, kv_rb], tKsK, tma_bar_ptr=bar_kv.get_barrier(0))
            cute.copy(tma_atom_V, tVgV[None, kv_rb], tVsV, tma_bar_ptr=bar_kv.get_barrier(0))
            self.load_q(tma_atom_Q, tQgQ, tQsQ, tma_atom_dO, tOgO, tOsO, bar_q, 2 * tile_bytes, 0,
                        bh * nb + mIdx[item, 0], mLSE2, mDelta, stat_ptr)
        bar_kv.wait(0, 0)
        if size < BLOCK:
            for r in cutlass.range(size, BLOCK, unroll=1):
                sK[r, tidx] = bf(0.0)
            cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier()

        if const_expr(flat):
            copy_dS, _, _ = quack_copy.get_smem_store_C(mma_s, sdSt, tidx, transpose=True, position_independent=True,
                                                         major_mode_size=BLOCK)
            self.steps_flat(tma_atom_Q, tQgQ, tQsQ, tma_atom_dO, tOgO, tOsO, bar_q, tile_bytes, mLSE2, mDelta,
                            stat_ptr, sStat, mIdx, mdQaccum, storage, mma_s, mma_kv, mma_dq, tSrK, tSrQ, tPrV, tPrdO,
                            tVrdOt, tKrQt, tQrdS, tQrKt0, acc_S, acc_dP, acc_dV, acc_dK, acc_dQ, acc_S_mn, acc_dP_mn,
                            tScS_mn, tP_view, tdS_view, rP, rdS, lse2, delta, copy_dS, scale_log2, tidx, warp_idx,
                            item, bh, nb, count, size)
        else:
            for t in cutlass.range(count, unroll=1):
                s = t % Q_STAGES
                qb = mIdx[item, t]
                q_rb = bh * nb + qb
                if const_expr(self.dq_reduce == "bulk"):
                    if tidx == 0 and t + 1 < count:  # step t-1's reduce has read the other slot
                        cute.arch.cp_async_bulk_wait_group(0, read=True)
                    cute.arch.barrier()
                if warp_idx == 0 and t + 1 < count:  # the next q block into the other slot (freed at t - 1)
                    self.load_q(tma_atom_Q, tQgQ, tQsQ, tma_atom_dO, tOgO, tOsO, bar_q, 2 * tile_bytes, (t + 1) % Q_STAGES,
                                bh * nb + mIdx[item, t + 1], mLSE2, mDelta, stat_ptr)
                row0 = q_rb * BLOCK
                if const_expr(not self.stats_in_smem):
                    for c in cutlass.range_constexpr(num_cols):
                        j = tScS_mn[0, c][1]
                        lse2[c] = mLSE2[row0 + j]
                        delta[c] = mDelta[row0 + j]
                bar_q.wait(s, (t // Q_STAGES) % 2)
                if const_expr(self.stats_in_smem):
                    for c in cutlass.range_constexpr(num_cols):
                        j = tScS_mn[0, c][1]
                        lse2[c] = sStat[s * (2 * BLOCK) + j]
                        delta[c] = sStat[s * (2 * BLOCK) + BLOCK + j]
                # S^T = K Q^T and dP^T = V dO^T in flight together
                self.gemm(mma_s, acc_S, tSrK, tSrQ[None, None, None, s], zero_init=True)
                self.gemm(mma_s, acc_dP, tPrV, tPrdO[None, None, None, s], zero_init=True)
                warpgroup.wait_group(1)
                probs_t(acc_S_mn, tScS_mn, lse2, scale_log2, size)
                rP.store(tP_view.load().to(bf))
                warpgroup.wait_group(0)
                dscores_t(acc_S_mn, acc_dP_mn, tScS_mn, delta, size)
                rdS.store(tdS_view.load().to(bf))
                # dV += P^T dO, dK += dS^T Q (A from registers); dS^T to shared memory meanwhile
                self.gemm(mma_kv, acc_dV, rP, tVrdOt[None, None, None, s], zero_init=False)
                self.gemm(mma_kv, acc_dK, rdS, tKrQt[None, None, None, s], zero_init=False)
                for i in cutlass.range_constexpr(cute.size(tSsdSt)):  # dS^T (C order) -> dS [q, kv]
                    tSsdSt[i] = bf(acc_dP[i])
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier()
                # dQ = dS K, two column halves, reduce-added into dq_accum
                if const_expr(self.dq_reduce == "atomic"):
                    self.gemm(mma_dq, acc_dQ, tQrdS, tQrKt0, zero_init=True)
                    warpgroup.wait_group(0)
                    self.reduce_dq(acc_dQ, thr_dq, mdQaccum, row0, 0)
                    self.gemm(mma_dq, acc_dQ, tQrdS, tQrKt1, zero_init=True)
                    warpgroup.wait_group(0)
                    self.reduce_dq(acc_dQ, thr_dq, mdQaccum, row0, HALF)
                    cute.arch.barrier()  # slot s, dS and K are read by no wgmma any more
                else:
                    # every wgmma of the step retires before slot s takes the dQ tile; the slot's
                    # previous bulk reduce (step t - 2) was waited for before its TMA refill at t - 1
                    self.gemm(mma_dq, acc_dQ, tQrdS, tQrKt0, zero_init=True)
                    warpgroup.wait_group(0)
                    cute.arch.barrier()  # no thread's wgmma reads slot s any more
                    stage_q = self.stage_view(storage.sQ.data_ptr(), s)
                    stage_o = self.stage_view(storage.sdO.data_ptr(), s)
                    self.stage_dq(acc_dQ, thr_dq, stage_q, stage_o, 0)
                    self.gemm(mma_dq, acc_dQ, tQrdS, tQrKt1, zero_init=True)
                    warpgroup.wait_group(0)
                    self.stage_dq(acc_dQ, thr_dq, stage_q, stage_o, HALF)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.barrier()  # the staged tile is complete; dS and K are read by no wgmma
                    if tidx == 0:
                        g0 = cute.domain_offset((row0, 0), mdQaccum)
                        g1 = cute.domain_offset((row0 + BLOCK // 2, 0), mdQaccum)
                        bulk_reduce_add_f32(stage_q.iterator, g0.iterator, BLOCK // 2 * HEAD_DIM * 4)
                        bulk_reduce_add_f32(stage_o.iterator, g1.iterator, BLOCK // 2 * HEAD_DIM * 4)
                        cute.arch.cp_async_bulk_commit_group()

        # ---- epilogue: dK (times sm_scale) and dV rows of the kv block; padded keys exactly 0
        self.store_dkv(acc_dK, acc_dV, thr_kv, mdK, mdV, kv_rb * BLOCK, size, sm_scale)
        if const_expr(self.dq_reduce != "atomic"):
            if tidx == 0:  # the staged tiles must stay until the TMA unit has read them
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def steps_flat(self, tma_atom_Q, tQgQ, tQsQ, tma_atom_dO, tOgO, tOsO, bar_q, tile_bytes: cutlass.Constexpr, mLSE2,
                   mDelta, stat_ptr, sStat, mIdx, mdQaccum, storage, mma_s, mma_kv, mma_dq, tSrK, tSrQ, tPrV, tPrdO,
                   tVrdOt, tKrQt, tQrdS, tQrKt, acc_S, acc_dP, acc_dV, acc_dK, acc_dQ, acc_S_mn, acc_dP_mn, tScS_mn,
                   tP_view, tdS_view, rP, rdS, lse2, delta, copy_dS, scale_log2, tidx, warp_idx, item, bh, nb, count,
                   size):
        """``dq_reduce="flat"``: the item's steps. Per step (slot ``s``): S^T and dP^T issued together;
        P^T once S^T retires and dV += P^T dO issued at once; dS^T once dP^T retires, written to dS by
        stmatrix; dK += dS^T Q and dQ = dS K issued as one group; the next q block's Q/dO/stats load
        behind them (into the other slot, once the reduce of the step before has read it); then dQ
        staged in register order into slot ``s`` (its Q half, then its dO half) and added by two 16 KB
        bulk reductions. Hazards: slot ``s`` takes dQ only after every wgmma of the step retired (CTA
        barrier); dS is rewritten only after the step before's dQ retired (same barrier)."""
        bf = self.dtype
        num_cols = cute.size(acc_S_mn, mode=[1])
        half = BLOCK * HEAD_DIM // 2  # floats of one staged half (16 KB)
        for t in cutlass.range(count, unroll=1):
            s = t % Q_STAGES
            q_rb = bh * nb + mIdx[item, t]
            bar_q.wait(s, (t // Q_STAGES) % 2)
            self.gemm(mma_s, acc_S, tSrK, tSrQ[None, None, None, s], zero_init=True)
            self.gemm(mma_s, acc_dP, tPrV, tPrdO[None, None, None, s], zero_init=True)
            for c in cutlass.range_constexpr(num_cols):
                j = tScS_mn[0, c][1]
                lse2[c] = sStat[s * (2 * BLOCK) + j]
                delta[c] = sStat[s * (2 * BLOCK) + BLOCK + j]
            warpgroup.wait_group(1)  # S^T retired
            probs_t(acc_S_mn, tScS_mn, lse2, scale_log2, size)
            rP.store(tP_view.load().to(bf))
            self.gemm(mma_kv, acc_dV, rP, tVrdOt[None, None, None, s], zero_init=False)
            warpgroup.wait_group(1)  # dP^T retired (dV may still run)
            dscores_t(acc_S_mn, acc_dP_mn, tScS_mn, delta, size)
            rdS.store(tdS_view.load().to(bf))
            copy_dS(rdS)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier()  # dS complete for the dQ wgmma
            self.gemm(mma_dq, acc_dQ, tQrdS, tQrKt, zero_init=True)
            self.gemm(mma_kv, acc_dK, rdS, tKrQt[None, None, None, s], zero_init=False)
            if warp_idx == 0 and t + 1 < count:  # the other slot: the reduce of step t - 1 has read it
                if tidx == 0:
                    cute.arch.cp_async_bulk_wait_group(0, read=True)
                cute.arch.sync_warp()
                self.load_q(tma_atom_Q, tQgQ, tQsQ, tma_atom_dO, tOgO, tOsO, bar_q, 2 * tile_bytes,
                            (t + 1) % Q_STAGES, bh * nb + mIdx[item, t + 1], mLSE2, mDelta, stat_ptr)
            warpgroup.wait_group(0)
            cute.arch.barrier()  # no wgmma reads slot s any more
            q_half = cute.recast_ptr(storage.sQ.data_ptr(), dtype=Float32) + s * half
            o_half = cute.recast_ptr(storage.sdO.data_ptr(), dtype=Float32) + s * half
            self.stage_flat(acc_dQ, q_half, o_half, tidx)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier()  # the staged tile is complete
            if tidx == 0:
                dst = mdQaccum.iterator + q_rb * (BLOCK * HEAD_DIM)
                bulk_reduce_add_f32(q_half, dst, half * 4)
                bulk_reduce_add_f32(o_half, dst + half, half * 4)
                cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def stage_flat(self, acc_dQ: cute.Tensor, q_half: cute.Pointer, o_half: cute.Pointer, tidx):
        """This thread's 64 dQ accumulator registers in register order: registers ``4 i .. 4 i + 3`` at
        floats ``512 i + 4 tidx`` of the 8192-float tile (``BlockSparseBwd64PostprocessFrag``'s order,
        the warp-specialized kernel's ``flat_dq``), ``i < 8`` in Q's half and ``i >= 8`` in dO's; 128-bit
        stores, a warp's covering 512 contiguous bytes (no bank conflict)."""
        off = cute.assume(tidx * 4, divby=4)
        src = cute.make_tensor(acc_dQ.iterator, cute.make_layout((4, 16), stride=(1, 4)))
        dst = cute.make_layout((4, 8), stride=(1, 4 * THREADS))
        cute.autovec_copy(cute.local_tile(src, (4, 8), (0, 0)), cute.make_tensor(q_half + off, dst))
        cute.autovec_copy(cute.local_tile(src, (4, 8), (0, 1)), cute.make_tensor(o_half + off, dst))

    @cute.jit
    def load_q(self, tma_atom_Q, tQgQ, tQsQ, tma_atom_dO, tOgO, tOsO, bar_q, tx_bytes: cutlass.Constexpr, slot, rb,
               mLSE2, mDelta, stat_ptr):
        """(warp 0) Q and dO rows of row block ``rb`` into ring slot ``slot``, on its barrier (with
        ``stats_in_smem`` also the block's lse2 and delta, 256 B each, into the slot's stat pair)."""
        stat_bytes = 2 * BLOCK * 4 if const_expr(self.stats_in_smem) else 0
        bar_q.arrive_and_expect_tx(slot, tx_bytes + stat_bytes)
        cute.copy(tma_atom_Q, tQgQ[None, rb], tQsQ[None, slot], tma_bar_ptr=bar_q.get_barrier(slot))
        cute.copy(tma_atom_dO, tOgO[None, rb], tOsO[None, slot], tma_bar_ptr=bar_q.get_barrier(slot))
        if const_expr(self.stats_in_smem):
            with cute.arch.elect_one():
                dst = stat_ptr + slot * (2 * BLOCK)
                bulk_copy_g2s(mLSE2.iterator + rb * BLOCK, dst, bar_q.get_barrier(slot), BLOCK * 4)
                bulk_copy_g2s(mDelta.iterator + rb * BLOCK, dst + BLOCK, bar_q.get_barrier(slot), BLOCK * 4)

    @cute.jit
    def gemm(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, tCrA: cute.Tensor, tCrB: cute.Tensor,
             zero_init: cutlass.Constexpr[bool]):
        """One wgmma group over the k-blocks (issued and committed; the caller waits)."""
        wgmma_gemm(tiled_mma, acc, tCrA, tCrB, zero_init)

    @cute.jit
    def reduce_dq(self, acc_dQ: cute.Tensor, thr_dq, mdQaccum: cute.Tensor, row0: Int32, col0: cutlass.Constexpr):
        """dq_accum[row0 + r, col0 + c] += acc (fp32 reductions, one per element)."""
        cQ = thr_dq.partition_C(cute.make_identity_tensor((BLOCK, HALF)))
        for i in cutlass.range_constexpr(cute.size(acc_dQ)):
            r, c = cQ[i]
            ptr = mdQaccum.iterator + cute.crd2idx((row0 + r, col0 + c), mdQaccum.layout)
            cute.arch.atomic_add(ptr, acc_dQ[i])

    def stage_view(self, base, slot) -> cute.Tensor:
        """Ring slot ``slot`` of a 64 x 128 bf16 ring (16 KB) as 32 x 128 fp32, row-major."""
        ptr = cute.recast_ptr(base + slot * (BLOCK * HEAD_DIM), dtype=Float32)
        return cute.make_tensor(ptr, cute.make_layout((BLOCK // 2, HEAD_DIM), stride=(HEAD_DIM, 1)))

    @cute.jit
    def stage_dq(self, acc_dQ: cute.Tensor, thr_dq, stage_q: cute.Tensor, stage_o: cute.Tensor,
                 col0: cutlass.Constexpr):
        """The dQ half (columns ``col0 .. col0 + 63``) into the staging rows: 0-31 in Q's slot, 32-63 in dO's."""
        cQ = thr_dq.partition_C(cute.make_identity_tensor((BLOCK, HALF)))
        for i in cutlass.range_constexpr(cute.size(acc_dQ)):
            r, c = cQ[i]
            if r < BLOCK // 2:
                stage_q[r, col0 + c] = acc_dQ[i]
            else:
                stage_o[r - BLOCK // 2, col0 + c] = acc_dQ[i]

    @cute.jit
    def store_dkv(self, acc_dK, acc_dV, thr_kv, mdK, mdV, row0: Int32, size: Int32, sm_scale: Float32):
        bf = self.dtype
        cKV = thr_kv.partition_C(cute.make_identity_tensor((BLOCK, HEAD_DIM)))
        for i in cutlass.range_constexpr(cute.size(acc_dK)):
            r, c = cKV[i]
            dk = acc_dK[i] * sm_scale
            dv = acc_dV[i]
            if r >= size:
                dk = Float32(0.0)
                dv = Float32(0.0)
            mdK[row0 + r, c] = bf(dk)
            mdV[row0 + r, c] = bf(dv)

    # ------------------------------------------------------------------ compilation
    def fake_args(self) -> tuple:
        return main_fake_args(self.dtype, io_align=16, tma_align=128)
