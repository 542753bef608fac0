# SPDX-License-Identifier: Apache-2.0
"""VSA block-sparse attention backward, 64-token blocks: the warp-specialized Hopper main kernel
with two q blocks per step (wgmma + TMA, sm_90a).

``block_sparse_bwd64_sm90_ws`` walks a kv block's k2q list one 64-row q block per step, and every
step pays the same hand-offs (Q/dO ring waits and releases, P^T ready / free, dS written and
fenced, the dQ tile staged) for 40 64x64x16-equivalent wgmma units. This build takes the list two
q blocks (``a`` = entry ``2t``, ``b`` = entry ``2t + 1``) per step, so each hand-off is paid once per
pair, and every MMA stays the base kernel's 64-wide one, issued once per half:

    WG0  warp 0  producer: per step Q[a], Q[b] (+ lse2) into the two halves of a Q ring stage and
                 dO[a], dO[b] (+ delta) into a dO ring stage (one barrier each, two TMA loads)
         warp 1  dQ store: the step's two 64 x 128 fp32 dQ tiles, one after the other through the
                 staging buffer (TMA tensor reduce-add each)
    WG1          S^T_a, S^T_b = K Q^T (RS: K in registers), P^T of both halves (fp32) handed to WG2
                 in one buffer pair, dV += P^T_a dO_a + P^T_b dO_b
    WG2          dP^T_a, dP^T_b = V dO^T (RS), dS^T per half (into registers for dK and by stmatrix
                 into shared memory for dQ), dK += dS^T_a Q_a + dS^T_b Q_b, dQ_a = dS_a K and
                 dQ_b = dS_b K (SS), each staged for the store warp

An odd list's last step loads its last q block into both halves and treats half ``b`` as a kv
block of size 0 (P^T and dS^T exactly 0 by the same selects; no dQ tile for it), so every step
moves the same bytes (one ``tx_count``). Shared memory (224 KB of the 227 KB): the Q and dO rings
are two stages of two 16 KB halves, P^T two 16 KB fp32 halves, dS's two 8 KB halves live in V's
buffer (V is read into WG2's registers before the first step, so ``kv_regs`` is required), the dQ
staging tile 32 KB.

Numerics are the base kernel's, operation for operation: the same MMAs on the same operands in the
same order per q block (dV and dK accumulate a's product before b's, as the base kernel's
consecutive steps do), the same selects. Everything else (work items, q groups, epilogue, padding,
limits) is ``block_sparse_bwd64_sm90_ws``'s, whose methods this class inherits.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from quack import copy_utils as quack_copy
from quack import layout_utils

from ..common.bulk import bulk_copy_g2s
from ..common.tma import tma_row_tiles
from ..common.wgmma import wgmma_gemm
from .block_sparse_bwd64_sm90_ws import (DQ_FREE, DQ_FULL, EPI_SYNC, EPI_WG1, LOG2E, P_FREE, P_READY, SMEM_LIMIT,
                                         WG, WG2_SYNC, BlockSparseBwd64Sm90Ws)
from .limits import BLOCK, HEAD_DIM
from .pointwise import dscores_t, probs_t

__all__ = ["BlockSparseBwd64Sm90WsPair", "pair_smem_bytes"]

Q_STAGES = 2  # ring stages (of two q blocks each): what fits beside the rest


def pair_smem_bytes(q_stages: int = Q_STAGES) -> int:
    """K, V (dS aliased into it), the Q and dO rings (two halves per stage), P^T (two fp32 halves),
    the dQ staging tile, the stats, barriers."""
    tile = BLOCK * HEAD_DIM * 2
    return (tile * (2 + 2 * 2 * q_stages) + 2 * BLOCK * BLOCK * 4 + BLOCK * HEAD_DIM * 4
            + 2 * 2 * BLOCK * 4 * q_stages + 8 * (1 + 4 * q_stages))


class BlockSparseBwd64Sm90WsPair(BlockSparseBwd64Sm90Ws):
    """The warp-specialized main kernel, two q blocks per step (module docstring); called like
    :class:`BlockSparseBwd64Sm90Ws` (same arguments, same chain)."""

    name = "block_sparse_bwd64_sm90_ws_pair"
    HALVES = 2

    def __init__(self, grouped: bool = False, bulk_dkv: bool = True, narrow_dq: bool = False):
        """``grouped`` / ``bulk_dkv`` / ``narrow_dq``: as :class:`BlockSparseBwd64Sm90Ws`; the rings, the
        P^T and dQ buffers and K/V in registers are fixed by shared memory (module docstring)."""
        need = pair_smem_bytes()
        if need > SMEM_LIMIT:  # a guard for edits of the layout above
            raise ValueError(f"the pair build needs {need} B of shared memory, more than {SMEM_LIMIT} B")
        super().__init__(q_stages=Q_STAGES, p_stages=1, dq_stages=1, kv_regs=True, grouped=grouped,
                         bulk_dkv=bulk_dkv, narrow_dq=narrow_dq)

    def config(self):
        return {"grouped": self.grouped, "bulk_dkv": self.bulk_dkv, "narrow_dq": self.narrow_dq}

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, mdQaccum: cute.Tensor, mLSE2: cute.Tensor, mDelta: cute.Tensor,
                 mIdx: cute.Tensor, mNum: cute.Tensor, mVbs: cute.Tensor, mOrder: cute.Tensor, mGB: cute.Tensor,
                 sm_scale: Float32, stream: cuda.CUstream):
        bf = self.dtype
        halves = self.q_stages * 2  # ring slots of one q block
        k_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, bf)
        tile_layout = cute.tile_to_shape(k_atom, (BLOCK, HEAD_DIM), order=(0, 1))
        ring_layout = cute.tile_to_shape(k_atom, (BLOCK, HEAD_DIM, halves), order=(0, 1, 2))
        ds_layout = cute.tile_to_shape(k_atom, (BLOCK, BLOCK, 2), order=(0, 1, 2))  # dS_a, dS_b [q, kv]
        f_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, Float32)
        dq_ring = cute.tile_to_shape(f_atom, (BLOCK, HEAD_DIM, 1), order=(0, 1, 2))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(g2s, mQ, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_dO, tma_dO = cpasync.make_tiled_tma_atom(g2s, mdO, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, tile_layout, (BLOCK, HEAD_DIM))
        dq_tile = cute.tile_to_shape(f_atom, (BLOCK, HEAD_DIM), order=(0, 1))
        tma_atom_dQ, tma_dQ = cpasync.make_tiled_tma_atom(cpasync.CopyReduceBulkTensorTileS2GOp(), mdQaccum, dq_tile,
                                                          (BLOCK, HEAD_DIM))

        K_MAJ, MN_MAJ = OperandMajorMode.K, OperandMajorMode.MN
        mma_s = sm90_helpers.make_trivial_tiled_mma(bf, bf, K_MAJ, K_MAJ, Float32, (1, 1, 1), tiler_mn=(BLOCK, BLOCK),
                                                    a_source=warpgroup.OperandSource.RMEM)
        mma_kv = sm90_helpers.make_trivial_tiled_mma(bf, bf, K_MAJ, MN_MAJ, Float32, (1, 1, 1),
                                                     tiler_mn=(BLOCK, HEAD_DIM), a_source=warpgroup.OperandSource.RMEM)
        mma_dq = sm90_helpers.make_trivial_tiled_mma(bf, bf, K_MAJ, MN_MAJ, Float32, (1, 1, 1),
                                                     tiler_mn=(BLOCK, HEAD_DIM))

        @cute.struct
        class SharedStorage:
            bar_kv: cute.struct.MemRange[cutlass.Int64, 1]
            bar_q: cute.struct.MemRange[cutlass.Int64, 2 * self.q_stages]
            bar_do: cute.struct.MemRange[cutlass.Int64, 2 * self.q_stages]
            sK: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(tile_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(tile_layout)], 1024]  # then dS_a, dS_b
            sQ: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ring_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ring_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[Float32, 2 * BLOCK * BLOCK], 128]  # thread-private order
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(dq_ring)], 1024]
            sLse: cute.struct.Align[cute.struct.MemRange[Float32, BLOCK * halves], 128]
            sDelta: cute.struct.Align[cute.struct.MemRange[Float32, BLOCK * halves], 128]

        scale_log2 = sm_scale * Float32(LOG2E)
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_dQ, tma_dQ,
            mdK, mdV, mLSE2, mDelta, mIdx, mNum, mVbs, mOrder, mGB, sm_scale, scale_log2,
            mma_s, mma_kv, mma_dq, tile_layout, ring_layout, ds_layout, dq_ring, SharedStorage,
        ).launch(grid=(cute.size(mGB.shape[0]) * (cute.size(mGB.shape[1]) - 1), 1, 1), block=(3 * WG, 1, 1),
                 smem=SharedStorage.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device side (the roles)
    @cute.jit
    def producer(self, tma_atom_Q, mQ, tma_atom_dO, mdO, tma_atom_K, mK, tma_atom_V, mV, mLSE2, mDelta, mIdx,
                 tile_layout, ring_layout, storage, bar_kv, pipe_q, pipe_do, item, bh, kv, nb, base, count, tile_bytes):
        sK = storage.sK.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sV = storage.sV.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sQ = storage.sQ.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdO = storage.sdO.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        tQsQ, tQgQ = tma_row_tiles(tma_atom_Q, mQ, sQ, (BLOCK, HEAD_DIM))
        tOsO, tOgO = tma_row_tiles(tma_atom_dO, mdO, sdO, (BLOCK, HEAD_DIM))
        tKsK, tKgK = tma_row_tiles(tma_atom_K, mK, sK, (BLOCK, HEAD_DIM))
        tVsV, tVgV = tma_row_tiles(tma_atom_V, mV, sV, (BLOCK, HEAD_DIM))
        lse_ptr = storage.sLse.data_ptr()
        delta_ptr = storage.sDelta.data_ptr()

        kv_rb = bh * nb + kv
        bar_kv.arrive_and_expect_tx(0, 2 * tile_bytes)
        cute.copy(tma_atom_K, tKgK[None, kv_rb], tKsK, tma_bar_ptr=bar_kv.get_barrier(0))
        cute.copy(tma_atom_V, tVgV[None, kv_rb], tVsV, tma_bar_ptr=bar_kv.get_barrier(0))
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.q_stages)
        last = count - 1
        for t in cutlass.range((count + 1) // 2, unroll=1):
            rb_a = bh * nb + mIdx[item, base + 2 * t]
            rb_b = bh * nb + mIdx[item, base + cutlass.min(2 * t + 1, last)]  # an odd list's last block twice
            s = state.index
            pipe_q.producer_acquire(state)
            bar = pipe_q.producer_get_barrier(state)
            cute.copy(tma_atom_Q, tQgQ[None, rb_a], tQsQ[None, 2 * s], tma_bar_ptr=bar)
            cute.copy(tma_atom_Q, tQgQ[None, rb_b], tQsQ[None, 2 * s + 1], tma_bar_ptr=bar)
            with cute.arch.elect_one():
                bulk_copy_g2s(mLSE2.iterator + rb_a * BLOCK, lse_ptr + (2 * s) * BLOCK, bar, BLOCK * 4)
                bulk_copy_g2s(mLSE2.iterator + rb_b * BLOCK, lse_ptr + (2 * s + 1) * BLOCK, bar, BLOCK * 4)
            pipe_do.producer_acquire(state)
            bar = pipe_do.producer_get_barrier(state)
            cute.copy(tma_atom_dO, tOgO[None, rb_a], tOsO[None, 2 * s], tma_bar_ptr=bar)
            cute.copy(tma_atom_dO, tOgO[None, rb_b], tOsO[None, 2 * s + 1], tma_bar_ptr=bar)
            with cute.arch.elect_one():
                bulk_copy_g2s(mDelta.iterator + rb_a * BLOCK, delta_ptr + (2 * s) * BLOCK, bar, BLOCK * 4)
                bulk_copy_g2s(mDelta.iterator + rb_b * BLOCK, delta_ptr + (2 * s + 1) * BLOCK, bar, BLOCK * 4)
            state.advance()

    @cute.jit
    def dq_store(self, tma_atom_dQ, mdQaccum, mIdx, dq_ring, storage, item, bh, nb, base, count):
        sdQ = storage.sdQ.get_tensor(dq_ring.outer, swizzle=dq_ring.inner)
        tDsD, tDgD = tma_row_tiles(tma_atom_dQ, mdQaccum, sdQ, (BLOCK, HEAD_DIM))
        for t in cutlass.range((count + 1) // 2, unroll=1):
            self.reduce_dq_tile(tma_atom_dQ, tDsD, tDgD, bh * nb + mIdx[item, base + 2 * t])
            if 2 * t + 1 < count:
                self.reduce_dq_tile(tma_atom_dQ, tDsD, tDgD, bh * nb + mIdx[item, base + 2 * t + 1])
        cute.arch.cp_async_bulk_wait_group(0, read=True)  # the buffer stays until the TMA unit has read it

    @cute.jit
    def reduce_dq_tile(self, tma_atom_dQ, tDsD, tDgD, rb):
        """One staged dQ tile into dq_accum's row block ``rb`` (the base kernel's step, one buffer)."""
        cute.arch.cp_async_bulk_wait_group(0, read=True)  # the previous tile's reduce has read the buffer
        cute.arch.barrier_arrive(barrier_id=DQ_FREE, number_of_threads=WG + 32)
        cute.arch.barrier(barrier_id=DQ_FULL, number_of_threads=WG + 32)
        cute.copy(tma_atom_dQ, tDsD[None, 0], tDgD[None, rb])
        cute.arch.cp_async_bulk_commit_group()

    @cute.jit
    def wg_s_dv(self, mdV, mma_s, mma_kv, tile_layout, ring_layout, storage, bar_kv, pipe_q, pipe_do, scale_log2,
                wtid, kv, bh, nb, count, size):
        bf = self.dtype
        sK = storage.sK.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sQ = storage.sQ.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdO = storage.sdO.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdOt = layout_utils.transpose_view(sdO)
        sLse = storage.sLse.get_tensor(cute.make_layout((BLOCK, 2 * self.q_stages)))
        thr_s = mma_s.get_slice(wtid)
        thr_kv = mma_kv.get_slice(wtid)
        tSrK = thr_s.make_fragment_A(thr_s.partition_A(sK))
        tSrQ = thr_s.make_fragment_B(thr_s.partition_B(sQ))
        tVrdOt = thr_kv.make_fragment_B(thr_kv.partition_B(sdOt))
        acc_Sa = cute.make_rmem_tensor(thr_s.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_Sb = cute.make_rmem_tensor(thr_s.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_dV = cute.make_rmem_tensor(thr_kv.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        acc_dV.fill(0.0)
        tScS_mn = layout_utils.reshape_acc_to_mn(thr_s.partition_C(cute.make_identity_tensor((BLOCK, BLOCK))))
        rPa = cute.make_rmem_tensor_like(layout_utils.reshape_acc_to_frgA(acc_Sa), bf)
        rPb = cute.make_rmem_tensor_like(layout_utils.reshape_acc_to_frgA(acc_Sb), bf)
        num_cols = cute.size(layout_utils.reshape_acc_to_mn(acc_Sa), mode=[1])
        lse2 = cute.make_rmem_tensor((num_cols,), Float32)

        bar_kv.wait(0, 0)
        self.load_a_regs(mma_s, sK, tSrK, wtid)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        pairs = (count + 1) // 2
        for t in cutlass.range(pairs, unroll=1):
            s = state.index
            size_b = size
            if 2 * t + 1 >= count:  # an odd list's last half: a kv block of size 0
                size_b = Int32(0)
            pipe_q.consumer_wait(state)
            wgmma_gemm(mma_s, acc_Sa, tSrK, tSrQ[None, None, None, 2 * s], True)
            wgmma_gemm(mma_s, acc_Sb, tSrK, tSrQ[None, None, None, 2 * s + 1], True)
            for c in cutlass.range_constexpr(num_cols):
                lse2[c] = sLse[tScS_mn[0, c][1], 2 * s]
            warpgroup.wait_group(1)
            probs_t(layout_utils.reshape_acc_to_mn(acc_Sa), tScS_mn, lse2, scale_log2, size)
            rPa.store(layout_utils.reshape_acc_to_frgA(acc_Sa).load().to(bf))
            for c in cutlass.range_constexpr(num_cols):
                lse2[c] = sLse[tScS_mn[0, c][1], 2 * s + 1]
            warpgroup.wait_group(0)
            pipe_q.consumer_release(state)
            probs_t(layout_utils.reshape_acc_to_mn(acc_Sb), tScS_mn, lse2, scale_log2, size_b)
            rPb.store(layout_utils.reshape_acc_to_frgA(acc_Sb).load().to(bf))
            if t >= 1:  # WG2 has read the previous step's P^T
                cute.arch.barrier(barrier_id=P_FREE, number_of_threads=2 * WG)
            cute.autovec_copy(acc_Sa, self.p_slot(storage, wtid, acc_Sa, 0))
            cute.autovec_copy(acc_Sb, self.p_slot(storage, wtid, acc_Sb, 1))
            cute.arch.barrier_arrive(barrier_id=P_READY, number_of_threads=2 * WG)
            pipe_do.consumer_wait(state)
            wgmma_gemm(mma_kv, acc_dV, rPa, tVrdOt[None, None, None, 2 * s], False)
            wgmma_gemm(mma_kv, acc_dV, rPb, tVrdOt[None, None, None, 2 * s + 1], False)
            warpgroup.wait_group(0)
            pipe_do.consumer_release(state)
            state.advance()
        if const_expr(self.bulk_dkv):  # into the dO ring, once WG2 (the ring's other reader) is done
            cute.arch.barrier(barrier_id=EPI_SYNC, number_of_threads=2 * WG)
            self.bulk_add_rows(acc_dV, thr_kv, storage.sdO.data_ptr(), mdV, (bh * nb + kv) * BLOCK, size,
                               Float32(1.0), wtid, EPI_WG1)
        else:
            self.store_rows(acc_dV, thr_kv, mdV, (bh * nb + kv) * BLOCK, size, Float32(1.0))

    @cute.jit
    def wg_dp_dq_dk(self, mdK, mma_s, mma_kv, mma_dq, tile_layout, ring_layout, ds_layout, dq_ring, storage, bar_kv,
                    pipe_q, pipe_do, sm_scale, wtid, kv, bh, nb, count, size):
        bf = self.dtype
        sK = storage.sK.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sV = storage.sV.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sQ = storage.sQ.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdO = storage.sdO.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdS = storage.sV.get_tensor(ds_layout.outer, swizzle=ds_layout.inner)  # V's buffer, once V is in registers
        sQt = layout_utils.transpose_view(sQ)
        sKt = layout_utils.transpose_view(sK)
        sdSt = layout_utils.transpose_view(sdS)
        sDelta = storage.sDelta.get_tensor(cute.make_layout((BLOCK, 2 * self.q_stages)))
        sdQ = storage.sdQ.get_tensor(dq_ring.outer, swizzle=dq_ring.inner)
        thr_s = mma_s.get_slice(wtid)
        thr_kv = mma_kv.get_slice(wtid)
        thr_dq = mma_dq.get_slice(wtid)
        tPrV = thr_s.make_fragment_A(thr_s.partition_A(sV))
        tPrdO = thr_s.make_fragment_B(thr_s.partition_B(sdO))
        tKrQt = thr_kv.make_fragment_B(thr_kv.partition_B(sQt))
        tQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS))  # (..., half)
        tQrKt = thr_dq.make_fragment_B(thr_dq.partition_B(sKt))
        acc_dPa = cute.make_rmem_tensor(thr_s.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_dPb = cute.make_rmem_tensor(thr_s.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_dK = cute.make_rmem_tensor(thr_kv.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        acc_dK.fill(0.0)
        rP = cute.make_rmem_tensor_like(acc_dPa, Float32)  # one half's P^T from WG1, in acc_dP's order
        rP_mn = layout_utils.reshape_acc_to_mn(rP)
        tScS_mn = layout_utils.reshape_acc_to_mn(thr_s.partition_C(cute.make_identity_tensor((BLOCK, BLOCK))))
        rdSa = cute.make_rmem_tensor_like(layout_utils.reshape_acc_to_frgA(acc_dPa), bf)
        rdSb = cute.make_rmem_tensor_like(layout_utils.reshape_acc_to_frgA(acc_dPb), bf)
        copy_dS, _, _ = quack_copy.get_smem_store_C(mma_s, sdSt, wtid, transpose=True, position_independent=True,
                                                     major_mode_size=BLOCK)
        acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        tQsdQ = thr_dq.partition_C(sdQ)
        num_cols = cute.size(layout_utils.reshape_acc_to_mn(acc_dPa), mode=[1])
        delta = cute.make_rmem_tensor((num_cols,), Float32)

        bar_kv.wait(0, 0)
        self.load_a_regs(mma_s, sV, tPrV, wtid)  # before K's padded rows are zeroed and dS overwrites V
        if size < BLOCK:  # K's padded rows to 0 for dQ = dS K (WG1's S^T discards them by select)
            for r in cutlass.range(size, BLOCK, unroll=1):
                sK[r, wtid] = bf(0.0)
            cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=WG2_SYNC, number_of_threads=WG)  # V read by every warp of WG2
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        pairs = (count + 1) // 2
        for t in cutlass.range(pairs, unroll=1):
            s = state.index
            has_b = 2 * t + 1 < count
            size_b = size
            if not has_b:
                size_b = Int32(0)
            pipe_q.consumer_wait(state)
            pipe_do.consumer_wait(state)
            wgmma_gemm(mma_s, acc_dPa, tPrV, tPrdO[None, None, None, 2 * s], True)
            wgmma_gemm(mma_s, acc_dPb, tPrV, tPrdO[None, None, None, 2 * s + 1], True)
            for c in cutlass.range_constexpr(num_cols):
                delta[c] = sDelta[tScS_mn[0, c][1], 2 * s]
            cute.arch.barrier(barrier_id=P_READY, number_of_threads=2 * WG)
            cute.autovec_copy(self.p_slot(storage, wtid, acc_dPa, 0), rP)
            warpgroup.wait_group(1)
            dscores_t(rP_mn, layout_utils.reshape_acc_to_mn(acc_dPa), tScS_mn, delta, size)
            rdSa.store(layout_utils.reshape_acc_to_frgA(acc_dPa).load().to(bf))
            copy_dS(rdSa, dst_idx=0)
            for c in cutlass.range_constexpr(num_cols):
                delta[c] = sDelta[tScS_mn[0, c][1], 2 * s + 1]
            cute.autovec_copy(self.p_slot(storage, wtid, acc_dPb, 1), rP)
            if t + 1 < pairs:  # WG1 writes both halves again next step
                cute.arch.barrier_arrive(barrier_id=P_FREE, number_of_threads=2 * WG)
            warpgroup.wait_group(0)
            pipe_do.consumer_release(state)
            dscores_t(rP_mn, layout_utils.reshape_acc_to_mn(acc_dPb), tScS_mn, delta, size_b)
            rdSb.store(layout_utils.reshape_acc_to_frgA(acc_dPb).load().to(bf))
            copy_dS(rdSb, dst_idx=1)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=WG2_SYNC, number_of_threads=WG)
            self.gemm_dq(mma_dq, acc_dQ, tQrdS[None, None, None, 0], tQrKt, size)
            wgmma_gemm(mma_kv, acc_dK, rdSa, tKrQt[None, None, None, 2 * s], False)
            wgmma_gemm(mma_kv, acc_dK, rdSb, tKrQt[None, None, None, 2 * s + 1], False)
            warpgroup.wait_group(2)  # dQ_a done (dK may still run)
            self.stage_dq(acc_dQ, tQsdQ)
            if has_b:
                self.gemm_dq(mma_dq, acc_dQ, tQrdS[None, None, None, 1], tQrKt, size)
                warpgroup.wait_group(0)
                self.stage_dq(acc_dQ, tQsdQ)
            else:
                warpgroup.wait_group(0)
            pipe_q.consumer_release(state)
            state.advance()
        if const_expr(self.bulk_dkv):  # into the Q ring, once WG1 (its other reader) is done
            cute.arch.barrier(barrier_id=EPI_SYNC, number_of_threads=2 * WG)
            self.bulk_add_rows(acc_dK, thr_kv, storage.sQ.data_ptr(), mdK, (bh * nb + kv) * BLOCK, size, sm_scale,
                               wtid, WG2_SYNC)
        else:
            self.store_rows(acc_dK, thr_kv, mdK, (bh * nb + kv) * BLOCK, size, sm_scale)

    @cute.jit
    def stage_dq(self, acc_dQ: cute.Tensor, tQsdQ: cute.Tensor):
        """The finished dQ tile into the staging buffer for the store warp (its last reduce has read
        the buffer: DQ_FREE), then DQ_FULL."""
        cute.arch.barrier(barrier_id=DQ_FREE, number_of_threads=WG + 32)
        cute.autovec_copy(acc_dQ, tQsdQ[None, None, None, 0])
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier_arrive(barrier_id=DQ_FULL, number_of_threads=WG + 32)
