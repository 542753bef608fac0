# SPDX-License-Identifier: Apache-2.0
"""VSA block-sparse forward, 128-token blocks: the two-group (QK warps / PV warps) mma.sync + TMA kernel.

Same contract as :mod:`.block_sparse_fwd128_sm120` (whose docstring states it); this is seed 004's
GB10 structure:
  - 512 threads, one CTA per SM (99 KB of shared memory). Two groups of eight warps, 16 query rows
    per warp: the QK group holds Q in registers, computes S = Q K^T and the online softmax, and
    publishes P (bf16) and the rows' rescale factors through shared memory; the PV group
    accumulates O = alpha * O + P V. Warp w of each group owns the same rows; while QK warp w
    computes chunk i+1's scores, PV warp w multiplies chunk i's P by V. The pair meets (a
    64-thread named barrier) only before P is overwritten; P-full is an mbarrier.
  - K (2 slots) and V (3 slots) stream in 64-key chunks by TMA (two 64x64 boxes, 128-byte
    swizzle) into separate rings. Every warp of a group walks the selection identically (the
    fill walker); the last warp of the group to finish reading a slot (a CTA-scoped acq_rel
    counter) refills it, so no warp waits for another to issue a load. Q arrives by TMA in the
    K slots, before the first K chunk.
  - The phased walk and the masking rules are those of the one-group kernel.
Shared memory: K 32 KB (Q aliases it) + V 48 KB + P 16 KB + 1 KB of row factors + barriers.

STATUS: verified on the H200 (sm_90a build): seed 004's acceptance tests pass
(``FASTVIDEO_CUTE_SM120_TEST_VARIANTS=ws pytest -m gpu tests/kernels/cute/test_block_sparse_fwd128_gpu.py``).
Its first runs hung on every walk of two or more chunks: a fill walker whose search found nothing
kept the last tile's size and took "its second half" again on the next call, so the two groups'
loop counts diverged (fixed in ``walk_next``). Measured 0.81-0.84x ``w4r3`` on the H200
(``benchmarks/results/vsa_h200_sm120_ws.json``); no arch defaults to it.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.memory
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from .block_sparse_fwd128_sm120 import (
    BLOCK,
    CHUNK,
    HEAD_DIM,
    SMEM_CAPACITY,
    _acc_as_a_operand,
    _mn_view,
    walk_entry,
)

K_STAGES = 2
V_STAGES = 3
GROUP_WARPS = 8
GROUP_THREADS = GROUP_WARPS * 32
# Named barriers: 0 the CTA; 1..8 the (QK warp w, PV warp w) pairs; 9 the QK group; 10 the PV group.
BAR_QK_GROUP = 9
BAR_PV_GROUP = 10


class BlockSparseFwd128Sm120WS:
    """Two-group mma.sync + TMA block-sparse forward (see the module docstring)."""

    def __init__(self):
        self.dtype = cutlass.BFloat16
        self.num_threads = 2 * GROUP_THREADS
        self.softmax_scale_log2 = (1.0 / math.sqrt(HEAD_DIM)) * math.log2(math.e)
        tile_bytes = 2 * CHUNK * HEAD_DIM * (K_STAGES + V_STAGES) + 2 * BLOCK * CHUNK + 8 * BLOCK
        assert tile_bytes + 2048 <= SMEM_CAPACITY, "exceeds the GB10's 99 KB of shared memory"

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mIdx: cute.Tensor,
        mNum: cute.Tensor,
        mVbs: cute.Tensor,
        num_slots: Int32,
        stream: cuda.CUstream,
    ):
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, self.dtype)
        sQ_layout = cute.tile_to_shape(atom, (BLOCK, HEAD_DIM), (0, 1))
        sK_layout = cute.tile_to_shape(atom, (CHUNK, HEAD_DIM, K_STAGES), (0, 1, 2))
        sV_layout = cute.tile_to_shape(atom, (CHUNK, HEAD_DIM, V_STAGES), (0, 1, 2))
        sP_layout = cute.tile_to_shape(atom, (BLOCK, CHUNK), (0, 1))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(g2s, mQ, sQ_layout, (BLOCK, HEAD_DIM))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, cute.select(sK_layout, mode=[0, 1]),
                                                        (CHUNK, HEAD_DIM))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, cute.select(sV_layout, mode=[0, 1]),
                                                        (CHUNK, HEAD_DIM))
        tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO, sQ_layout,
                                                        (BLOCK, HEAD_DIM))
        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)),
            (GROUP_WARPS, 1, 1),
            permutation_mnk=(GROUP_WARPS * 16, 16, 16),
        )

        @cute.struct
        class SharedStorage:
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sV_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sP_layout)], 1024]
            alpha: cute.struct.MemRange[Float32, BLOCK]
            sums: cute.struct.MemRange[Float32, BLOCK]
            # q_full, k_full[2], v_full[3], p_full[8]
            mbar: cute.struct.MemRange[cutlass.Int64, 1 + K_STAGES + V_STAGES + GROUP_WARPS]
            # readers of each K and V slot so far
            counters: cute.struct.MemRange[Int32, K_STAGES + V_STAGES]

        tiles = cute.size(mVbs.shape[0])
        batch_heads = cute.size(mNum.shape[0]) // tiles
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, tma_O,
            mIdx, mNum, mVbs, num_slots, sQ_layout, sK_layout, sV_layout, sP_layout, tiled_mma, SharedStorage,
        ).launch(
            grid=(tiles, batch_heads, 1),
            block=(self.num_threads, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------ the walk
    @cute.jit
    def walk_next(self, mIdx, mVbs, query, start, count, tiles, pos, kv_tile, valid, half):
        """Advance the fill walker to the next 64-key chunk: the second half of the current tile
        if it has more than 64 valid keys, else the first half of the next tile with any.
        Returns (pos, kv_tile, valid, half, found)."""
        found = Int32(0)
        if half == 0 and valid > CHUNK:
            half = Int32(1)
            found = Int32(1)
        else:
            half = Int32(0)
            # A search that finds nothing must leave the walker spent: with the last tile's size
            # kept, the next call would take "its second half" again (a chunk the other group never
            # sees: the two groups' loop counts diverge and the CTA hangs).
            valid = Int32(0)
            while found == 0 and pos < count:
                kv_tile, valid = walk_entry(mIdx, mVbs, query, pos, start, count, tiles)
                pos = pos + 1
                if valid > 0:
                    found = Int32(1)
        return pos, kv_tile, valid, half, found

    @cute.jit
    def last_reader(self, counter_ptr, lane):
        """One arrival of this warp at a slot's reader counter; True (warp-uniform) for the 8th."""
        cute.arch.sync_warp()
        old = Int32(0)
        if lane == 0:
            old = cute.arch.atomic_add(counter_ptr, Int32(1), sem="acq_rel", scope="cta")
        old = cute.arch.shuffle_sync(old, 0)
        return old == GROUP_WARPS - 1

    @cute.jit
    def issue(self, tma_atom, tG, tS, chunk, stage, full_ptr, counter_ptr, reset: cutlass.Constexpr):
        """Load chunk ``chunk`` into slot ``stage`` (called by a whole warp)."""
        with cute.arch.elect_one():
            if const_expr(reset):
                cute.make_tensor(counter_ptr, cute.make_layout(1))[0] = Int32(0)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.mbarrier_arrive_and_expect_tx(full_ptr, CHUNK * HEAD_DIM * 2)
        cute.copy(tma_atom, tG[None, chunk], tS[None, stage], tma_bar_ptr=full_ptr)

    # ------------------------------------------------------------------ kernel
    @cute.kernel
    def kernel(self, tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, tma_atom_O, mO, mIdx, mNum, mVbs,
               num_slots: Int32, sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout,
               sV_layout: cute.ComposedLayout, sP_layout: cute.ComposedLayout, tiled_mma: cute.TiledMma,
               SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        tile, bh, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        lane = cute.arch.lane_idx()

        tiles = mVbs.shape[0]
        max_kv = mIdx.shape[1]
        query = bh * tiles + tile
        rows = cutlass.min(cutlass.max(mVbs[tile], Int32(0)), Int32(BLOCK))
        count = cutlass.min(cutlass.max(mNum[query], Int32(0)), max_kv)
        if rows == 0:
            count = Int32(0)
        start = Int32(0)
        if 2 * count <= tiles:
            start = (query % num_slots) * count // num_slots

        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
        # Q arrives in the K slots (the QK warps copy it to registers first); O leaves from the V slots.
        sQ = storage.sK.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sO = storage.sV.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        mbar = storage.mbar.data_ptr()
        counters = storage.counters.data_ptr()
        counters_t = storage.counters.get_tensor(cute.make_layout(K_STAGES + V_STAGES))
        if tidx == 0:
            cute.arch.mbarrier_init(mbar, 1)
            for s in cutlass.range_constexpr(K_STAGES + V_STAGES):
                cute.arch.mbarrier_init(mbar + 1 + s, 1)
                counters_t[s] = Int32(0)
            for w in cutlass.range_constexpr(GROUP_WARPS):
                cute.arch.mbarrier_init(mbar + 1 + K_STAGES + V_STAGES + w, 32)
            cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        unit = cute.make_layout(1)
        gK = cute.local_tile(mK, (CHUNK, HEAD_DIM), (None, 0))
        gV = cute.local_tile(mV, (CHUNK, HEAD_DIM), (None, 0))
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, unit, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, unit, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        head_chunk = bh * tiles * 2
        scale_log2 = Float32(self.softmax_scale_log2)

        if warp_idx < GROUP_WARPS:
            # ================================================================ QK group
            w = warp_idx
            thr_mma = tiled_mma.get_slice(tidx)
            ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
            thr_copy_Q = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(tidx)
            thr_copy_K = cute.make_tiled_copy_B(ldsm, tiled_mma).get_slice(tidx)
            tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
            tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
            tSsK = thr_copy_K.partition_S(sK)
            tSrK_view = thr_copy_K.retile(tSrK)
            acc_S_shape = thr_mma.partition_shape_C((BLOCK, CHUNK))
            tScS = thr_mma.partition_C(cute.make_identity_tensor((BLOCK, CHUNK)))
            tScS_mn = _mn_view(tScS)
            num_rows = cute.size(tScS_mn, mode=[0])
            row_max = cute.make_rmem_tensor((num_rows,), Float32)
            row_sum = cute.make_rmem_tensor((num_rows,), Float32)
            row_max.fill(-Float32.inf)
            row_sum.fill(0.0)
            st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=32)
            thr_copy_P = cute.make_tiled_copy_C(st_atom, tiled_mma).get_slice(tidx)
            tPsP = thr_copy_P.partition_D(sP)
            alpha_s = storage.alpha.get_tensor(cute.make_layout(BLOCK))
            sums_s = storage.sums.get_tensor(cute.make_layout(BLOCK))
            p_full = mbar + 1 + K_STAGES + V_STAGES + w

            if count > 0:
                # Q: one TMA into the K slots, copied to registers by every QK warp.
                if w == 0:
                    with cute.arch.elect_one():
                        cute.arch.mbarrier_arrive_and_expect_tx(mbar, BLOCK * HEAD_DIM * 2)
                    gQ = cute.local_tile(mQ, (BLOCK, HEAD_DIM), (None, 0))
                    tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, unit, cute.group_modes(sQ, 0, 2),
                                                       cute.group_modes(gQ, 0, 2))
                    cute.copy(tma_atom_Q, tQgQ[None, query], tQsQ, tma_bar_ptr=mbar)
                cute.arch.mbarrier_wait(mbar, 0)
                cute.copy(thr_copy_Q, thr_copy_Q.partition_S(sQ), thr_copy_Q.retile(tSrQ))
            # Every QK warp has its Q before the K slots are overwritten.
            cute.arch.barrier(barrier_id=BAR_QK_GROUP, number_of_threads=GROUP_THREADS)

            pos, kv_tile, valid, half = Int32(0), Int32(0), Int32(0), Int32(0)
            pending = Int32(0)
            keys0, keys1 = Int32(0), Int32(0)
            pos, kv_tile, valid, half, found = self.walk_next(mIdx, mVbs, query, start, count, tiles,
                                                              pos, kv_tile, valid, half)
            if found != 0:
                keys0 = cutlass.min(valid - half * CHUNK, Int32(CHUNK))
                pending = pending + 1
                if w == 0:
                    self.issue(tma_atom_K, tKgK, tKsK, head_chunk + kv_tile * 2 + half, 0, mbar + 1, counters, False)
                pos, kv_tile, valid, half, found = self.walk_next(mIdx, mVbs, query, start, count, tiles,
                                                                  pos, kv_tile, valid, half)
                if found != 0:
                    keys1 = cutlass.min(valid - half * CHUNK, Int32(CHUNK))
                    pending = pending + 1
                    if w == 0:
                        self.issue(tma_atom_K, tKgK, tKsK, head_chunk + kv_tile * 2 + half, 1, mbar + 2,
                                   counters + 1, False)

            it = Int32(0)
            while pending > 0:
                stage = it & 1
                cute.arch.mbarrier_wait(mbar + 1 + stage, (it >> 1) & 1)
                # ---- S = Q K^T
                acc_S = cute.make_rmem_tensor(acc_S_shape, Float32)
                acc_S.fill(0.0)
                tSsK_cur = tSsK[None, None, None, stage]
                cute.copy(thr_copy_K, tSsK_cur[None, None, 0], tSrK_view[None, None, 0])
                for k in cutlass.range_constexpr(cute.size(tSrQ, mode=[2])):
                    if const_expr(k + 1 < cute.size(tSrQ, mode=[2])):
                        cute.copy(thr_copy_K, tSsK_cur[None, None, k + 1], tSrK_view[None, None, k + 1])
                    cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)
                keys = keys1 if stage == 1 else keys0
                if keys < CHUNK:
                    for i in cutlass.range_constexpr(cute.size(acc_S)):
                        if tScS[i][1] >= keys:
                            acc_S[i] = -Float32.inf
                # ---- online softmax
                acc_S_mn = _mn_view(acc_S)
                alpha = cute.make_rmem_tensor((num_rows,), Float32)
                for r in cutlass.range_constexpr(num_rows):
                    row = acc_S_mn[r, None].load()
                    cur_max = row.reduce(cute.ReductionOp.MAX, row_max[r], 0)
                    cur_max = cute.arch.warp_reduction_max(cur_max, threads_in_group=4)
                    prev_max = row_max[r]
                    row_max[r] = cur_max
                    safe_max = Float32(0.0) if cur_max == -Float32.inf else cur_max
                    p = cute.math.exp2(row * scale_log2 - safe_max * scale_log2, fastmath=True)
                    acc_S_mn[r, None].store(p)
                    alpha[r] = cute.math.exp2((prev_max - safe_max) * scale_log2, fastmath=True)
                    row_sum[r] = row_sum[r] * alpha[r] + p.reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                rP = cute.make_rmem_tensor(acc_S_shape, self.dtype)
                rP.store(acc_S.load().to(self.dtype))
                # ---- publish P and alpha once the PV partner has read the previous ones
                if it > 0:
                    cute.arch.barrier(barrier_id=1 + w, number_of_threads=64)
                cute.copy(thr_copy_P, thr_copy_P.retile(rP), tPsP)
                if lane % 4 == 0:
                    for r in cutlass.range_constexpr(num_rows):
                        alpha_s[tScS_mn[r, 0][0]] = alpha[r]
                cute.arch.mbarrier_arrive(p_full)
                # ---- refill the K slot just read with the chunk two ahead
                pos, kv_tile, valid, half, found = self.walk_next(mIdx, mVbs, query, start, count, tiles,
                                                                  pos, kv_tile, valid, half)
                if found != 0:
                    nkeys = cutlass.min(valid - half * CHUNK, Int32(CHUNK))
                    if stage == 1:
                        keys1 = nkeys
                    else:
                        keys0 = nkeys
                    if self.last_reader(counters + stage, lane):
                        self.issue(tma_atom_K, tKgK, tKsK, head_chunk + kv_tile * 2 + half, stage, mbar + 1 + stage,
                                   counters + stage, True)
                else:
                    pending = pending - 1
                it = it + 1
            if it > 0:
                cute.arch.barrier(barrier_id=1 + w, number_of_threads=64)
            for r in cutlass.range_constexpr(num_rows):
                total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
                if lane % 4 == 0:
                    sums_s[tScS_mn[r, 0][0]] = total
            cute.arch.barrier()
        else:
            # ================================================================ PV group
            w = warp_idx - GROUP_WARPS
            ptid = tidx - GROUP_THREADS
            thr_mma = tiled_mma.get_slice(ptid)
            ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
            ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
            thr_copy_P = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(ptid)
            thr_copy_V = cute.make_tiled_copy_B(ldsm_t, tiled_mma).get_slice(ptid)
            sVt = cute.make_tensor(sV.iterator, cute.select(sV.layout, mode=[1, 0, 2]))
            tOrP = thr_mma.make_fragment_A(thr_mma.partition_A(sP))
            tOrP_view = thr_copy_P.retile(tOrP)
            tOsP = thr_copy_P.partition_S(sP)
            tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))
            tOrVt_view = thr_copy_V.retile(tOrVt)
            tOsVt = thr_copy_V.partition_S(sVt)
            tOcVt = thr_mma.partition_B(cute.make_identity_tensor((HEAD_DIM, CHUNK)))
            acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
            acc_O.fill(0.0)
            acc_O_mn = _mn_view(acc_O)
            tOcO_mn = _mn_view(thr_mma.partition_C(cute.make_identity_tensor((BLOCK, HEAD_DIM))))
            num_rows = cute.size(acc_O_mn, mode=[0])
            alpha_s = storage.alpha.get_tensor(cute.make_layout(BLOCK))
            sums_s = storage.sums.get_tensor(cute.make_layout(BLOCK))
            p_full = mbar + 1 + K_STAGES + V_STAGES + w
            v_full = mbar + 1 + K_STAGES
            v_counters = counters + K_STAGES

            pos, kv_tile, valid, half = Int32(0), Int32(0), Int32(0), Int32(0)
            pending = Int32(0)
            vkeys = Int32(0)  # each V slot's valid keys, 8 bits per slot
            for s in cutlass.range_constexpr(V_STAGES):
                pos, kv_tile, valid, half, found = self.walk_next(mIdx, mVbs, query, start, count, tiles,
                                                                  pos, kv_tile, valid, half)
                if found != 0:
                    pending = pending + 1
                    vkeys = vkeys | (cutlass.min(valid - half * CHUNK, Int32(CHUNK)) << (8 * s))
                    if w == 0:
                        self.issue(tma_atom_V, tVgV, tVsV, head_chunk + kv_tile * 2 + half, s, v_full + s,
                                   v_counters + s, False)

            it = Int32(0)
            stage = Int32(0)
            phase = Int32(0)
            while pending > 0:
                cute.arch.mbarrier_wait(v_full + stage, phase)
                cute.arch.mbarrier_wait(p_full, it & 1)
                cute.copy(thr_copy_P, tOsP, tOrP_view)
                a0 = alpha_s[tOcO_mn[0, 0][0]]
                a1 = alpha_s[tOcO_mn[1, 0][0]]
                cute.arch.barrier(barrier_id=1 + w, number_of_threads=64)
                for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                    acc_O_mn[0, c] = acc_O_mn[0, c] * a0
                    acc_O_mn[1, c] = acc_O_mn[1, c] * a1
                keys = (vkeys >> (8 * stage)) & 255
                tOsVt_cur = tOsVt[None, None, None, stage]
                for k in cutlass.range_constexpr(cute.size(tOrVt, mode=[2])):
                    cute.copy(thr_copy_V, tOsVt_cur[None, None, k], tOrVt_view[None, None, k])
                    if keys < CHUNK:
                        tOrVt_k = tOrVt[None, None, k]
                        tOcVt_k = tOcVt[None, None, k]
                        for i in cutlass.range_constexpr(cute.size(tOrVt_k)):
                            if tOcVt_k[i][1] >= keys:
                                tOrVt_k[i] = self.dtype(0.0)
                    cute.gemm(tiled_mma, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)
                # ---- refill the V slot just read with the chunk three ahead
                pos, kv_tile, valid, half, found = self.walk_next(mIdx, mVbs, query, start, count, tiles,
                                                                  pos, kv_tile, valid, half)
                if found != 0:
                    nkeys = cutlass.min(valid - half * CHUNK, Int32(CHUNK))
                    vkeys = (vkeys & ~(255 << (8 * stage))) | (nkeys << (8 * stage))
                    if self.last_reader(v_counters + stage, lane):
                        self.issue(tma_atom_V, tVgV, tVsV, head_chunk + kv_tile * 2 + half, stage, v_full + stage,
                                   v_counters + stage, True)
                else:
                    pending = pending - 1
                stage = stage + 1
                if stage == V_STAGES:
                    stage = Int32(0)
                    phase = phase ^ 1
                it = it + 1
            # The QK group has published the row sums, and every warp is done with the V slots.
            cute.arch.barrier()
            for r in cutlass.range_constexpr(num_rows):
                row_idx = tOcO_mn[r, 0][0]
                total = sums_s[row_idx]
                empty = total == Float32(0.0)
                inv = Float32(1.0) / (Float32(1.0) if empty else total)
                keep = (not empty) and row_idx < rows
                for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                    acc_O_mn[r, c] = acc_O_mn[r, c] * inv if keep else Float32(0.0)
            rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
            rO.store(acc_O.load().to(self.dtype))
            st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=32)
            thr_copy_O = cute.make_tiled_copy_C(st_atom, tiled_mma).get_slice(ptid)
            cute.copy(thr_copy_O, thr_copy_O.retile(rO), thr_copy_O.partition_D(sO))
            cute.arch.fence_view_async_shared()
            cute.arch.barrier(barrier_id=BAR_PV_GROUP, number_of_threads=GROUP_THREADS)
            if w == 0:
                gO = cute.local_tile(mO, (BLOCK, HEAD_DIM), (None, 0))
                tOsO, tOgO = cpasync.tma_partition(tma_atom_O, 0, unit, cute.group_modes(sO, 0, 2),
                                                   cute.group_modes(gO, 0, 2))
                cute.copy(tma_atom_O, tOsO, tOgO[None, query])
                cute.arch.cp_async_bulk_commit_group()
                cute.arch.cp_async_bulk_wait_group(0, read=True)

    # ------------------------------------------------------------------ compilation
    def fake_args(self) -> tuple:
        from .block_sparse_fwd128_sm120 import BlockSparseFwd128Sm120

        return BlockSparseFwd128Sm120.fake_args(self)

    def compile(self, arch: str | None = None, tvm_ffi: bool = True):
        options = []
        if tvm_ffi:
            options.append("--enable-tvm-ffi")
        if arch is not None:
            options.append(f"--gpu-arch {arch}")
        return cute.compile(self, *self.fake_args(), options=" ".join(options))
