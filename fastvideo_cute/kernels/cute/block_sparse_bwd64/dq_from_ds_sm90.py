# SPDX-License-Identifier: Apache-2.0
"""dQ of the 64-token VSA backward from stored dS tiles, q-owned (wgmma + TMA, sm_90a).

Since 2026-12-07 (twenty-fifth session): the second half of a split backward in which the
kv-owned main kernel (``BlockSparseBwd64Sm90Ws(ds_out=True)``) stores each (q block, kv block)
pair's bf16 dS tile (64 x 64, the 8 KB shared-memory image its own dQ = dS K would have read)
instead of computing dQ and reduce-adding 32 KB of fp32 into ``dq_accum``. This kernel then sums
``dQ_i = sm_scale * sum_j dS_ij K_j`` over q block ``i``'s q2k list in registers (fp32, one fixed
order: dq is the same bits run to run) and writes bf16 rows once. Routed for q2k lists that arrive
as lists (``backends/sm90_backend._split_plan``).

Dataflow (one CTA per q work item ``(b*H + h) * nq + i``; warps 0-3 one MMA warpgroup, warp 4 the
producer; ``stages`` deep ring of (K tile 16 KB, dS tile 8 KB) slots on one TMA barrier each):

    producer   for s < num[item]: j = idx[item, s]; K rows of kv block (b*H + h) * nb + j by TMA,
               dS tile off[item] + s by one 8 KB bulk copy (the image is copied as stored: the
               swizzle is the slot's own)
    MMA WG     wait slot; a partial kv tile (vbs[j] < 64) zeroes K's padded rows in the slot (dS's
               columns there are exact 0s, K's rows may hold NaN/Inf: 0 * NaN); acc += dS K (SS
               wgmma 64 x 128 x 64, dS K-major, K MN-major), one group in flight: the slot of step
               s - 1 is released once step s's group is issued and s - 1's has retired
    epilogue   dq rows = bf16(acc * sm_scale), rows with lse == -inf exactly 0 (the postprocess's rule)

Constraints: head_dim 128, bf16, 64-row tiles; ``K``, ``dq`` 2-D row views ``[R, 128]`` (``R`` =
items x 64 of the padded tile layout), ``dS`` a flat bf16 vector of 4096-element tiles, lists
int32 ``[items, width]`` (entries past ``num`` never read), ``off`` int32 ``[items]``.
"""

from __future__ import annotations

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from quack import layout_utils

from fastvideo_cute.jit import CuteKernel, fake_matrix, fake_stream, fake_vector

from ..common.bulk import L2_EVICT_FIRST, L2_EVICT_LAST, bulk_copy_g2s, tma_policy
from ..common.tma import tma_row_tiles
from ..common.wgmma import wgmma_gemm
from .limits import BLOCK, HEAD_DIM

__all__ = ["BlockSparseDq64Sm90", "DS_TILE_ELEMS"]

WG = 128
THREADS = WG + 32  # one MMA warpgroup + the producer warp
DS_TILE_ELEMS = BLOCK * BLOCK  # bf16 elements of one stored dS tile (8 KB)
ZERO_SYNC = 1  # named barrier: K's padded rows zeroed by the warpgroup


class BlockSparseDq64Sm90(CuteKernel):
    """The q-owned dQ kernel (module docstring). Called (compiled) as ``fn(k2d, ds, dq2d, lse, idx2d, num,
    off, vbs, sm_scale)``."""

    name = "block_sparse_dq64_sm90"

    def __init__(self, stages: int = 4, ctas_per_sm: int = 2, ds_evict_first: bool = False, k_evict_last: bool = False):
        """``stages`` / ``ctas_per_sm``: the ring's depth and the CTAs an SM holds (defaults: the split chain's
        ring, ``adapters/cute_sm90_bwd64_split.DQ_CONFIG``, measured there; that build also turns the first
        hint on); ``ds_evict_first``: the dS tiles (read once, from DRAM) loaded with the L2 policy
        evict_first, ``k_evict_last``: the K tiles (read by every q block that selected them) with evict_last,
        so that the stream of dS does not push the head's K out of the L2 (cache hints only: the same bits)."""
        if stages not in (2, 3, 4):
            raise ValueError(f"stages must be 2, 3 or 4, got {stages}")
        if ctas_per_sm not in (1, 2, 3):
            raise ValueError(f"ctas_per_sm must be 1, 2 or 3, got {ctas_per_sm}")
        need = ctas_per_sm * (stages * (BLOCK * HEAD_DIM * 2 + DS_TILE_ELEMS * 2) + 2048)
        if need > 228 * 1024:
            raise ValueError(f"stages={stages} at {ctas_per_sm} CTAs per SM need {need} B of shared memory")
        self.stages, self.ctas_per_sm = int(stages), int(ctas_per_sm)
        self.ds_evict_first, self.k_evict_last = bool(ds_evict_first), bool(k_evict_last)
        self.dtype = cutlass.BFloat16

    def config(self):
        return {"stages": self.stages, "ctas_per_sm": self.ctas_per_sm,
                **({"ds_evict_first": True} if self.ds_evict_first else {}),
                **({"k_evict_last": True} if self.k_evict_last else {})}

    @cute.jit
    def __call__(self, mK: cute.Tensor, mdS: cute.Tensor, mdQ: cute.Tensor, mLSE: cute.Tensor, mIdx: cute.Tensor,
                 mNum: cute.Tensor, mOff: cute.Tensor, mVbs: cute.Tensor, sm_scale: Float32, stream: cuda.CUstream):
        bf = self.dtype
        k_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, bf)
        k_ring = cute.tile_to_shape(k_atom, (BLOCK, HEAD_DIM, self.stages), order=(0, 1, 2))
        ds_ring = cute.tile_to_shape(k_atom, (BLOCK, BLOCK, self.stages), order=(0, 1, 2))  # dS [q, kv]
        k_tile = cute.tile_to_shape(k_atom, (BLOCK, HEAD_DIM), order=(0, 1))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileG2SOp(), mK, k_tile,
                                                        (BLOCK, HEAD_DIM))
        mma = sm90_helpers.make_trivial_tiled_mma(bf, bf, OperandMajorMode.K, OperandMajorMode.MN, Float32,
                                                  (1, 1, 1), tiler_mn=(BLOCK, HEAD_DIM))

        @cute.struct
        class SharedStorage:
            bar: cute.struct.MemRange[cutlass.Int64, 2 * self.stages]
            sK: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(k_ring)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ds_ring)], 1024]

        self.kernel(tma_atom_K, tma_K, mdS, mdQ, mLSE, mIdx, mNum, mOff, mVbs, sm_scale, mma, k_ring, ds_ring,
                    SharedStorage).launch(grid=(cute.size(mNum.shape[0]), 1, 1), block=(THREADS, 1, 1),
                                          smem=SharedStorage.size_in_bytes(), stream=stream,
                                          min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=100)

    @cute.kernel
    def kernel(self, tma_atom_K: cute.CopyAtom, mK: cute.Tensor, mdS: cute.Tensor, mdQ: cute.Tensor,
               mLSE: cute.Tensor, mIdx: cute.Tensor, mNum: cute.Tensor, mOff: cute.Tensor, mVbs: cute.Tensor,
               sm_scale: Float32, mma: cute.TiledMma, k_ring: cute.ComposedLayout, ds_ring: cute.ComposedLayout,
               SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        item, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        nq = cute.size(mVbs.shape[0])  # q and kv blocks per sequence (self-attention layout)
        bh = item // nq
        num = cutlass.min(cutlass.max(mNum[item], Int32(0)), mIdx.shape[1])
        off = mOff[item]
        if warp_idx == 4:
            cpasync.prefetch_descriptor(tma_atom_K)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        sK = storage.sK.get_tensor(k_ring.outer, swizzle=k_ring.inner)
        sdS = storage.sdS.get_tensor(ds_ring.outer, swizzle=ds_ring.inner)
        k_bytes = BLOCK * HEAD_DIM * 2
        ds_bytes = DS_TILE_ELEMS * 2
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.bar.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, WG // 32),
            tx_count=k_bytes + ds_bytes, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if warp_idx == 4:
            tKsK, tKgK = tma_row_tiles(tma_atom_K, mK, sK, (BLOCK, HEAD_DIM))
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, self.stages)
            for s in cutlass.range(num, unroll=1):
                j = mIdx[item, s]
                st = state.index
                pipe.producer_acquire(state)
                cute.copy(tma_atom_K, tKgK[None, bh * nq + j], tKsK[None, st], tma_bar_ptr=pipe.producer_get_barrier(state),
                          **tma_policy(L2_EVICT_LAST if self.k_evict_last else 0))
                with cute.arch.elect_one():
                    bulk_copy_g2s(mdS.iterator + cutlass.Int64(off + s) * DS_TILE_ELEMS, storage.sdS.data_ptr() + st * DS_TILE_ELEMS,
                                  pipe.producer_get_barrier(state), ds_bytes,
                                  cache_hint=L2_EVICT_FIRST if self.ds_evict_first else 0)
                state.advance()
        else:
            wtid = tidx
            thr = mma.get_slice(wtid)
            sKt = layout_utils.transpose_view(sK)
            tCrA = thr.make_fragment_A(thr.partition_A(sdS))
            tCrB = thr.make_fragment_B(thr.partition_B(sKt))
            acc = cute.make_rmem_tensor(thr.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
            acc.fill(0.0)
            state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            done = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)  # one step behind
            for s in cutlass.range(num, unroll=1):
                st = state.index
                size = cutlass.min(cutlass.max(mVbs[mIdx[item, s]], Int32(0)), Int32(BLOCK))
                pipe.consumer_wait(state)
                if size < BLOCK:  # K's padded rows to 0 (dS's columns there are 0; K's rows may be NaN)
                    for r in cutlass.range(size, BLOCK, unroll=1):
                        sK[r, wtid, st] = self.dtype(0.0)
                    cute.arch.fence_proxy("async.shared", space="cta")
                    cute.arch.barrier(barrier_id=ZERO_SYNC, number_of_threads=WG)
                wgmma_gemm(mma, acc, tCrA[None, None, None, st], tCrB[None, None, None, st], False)
                warpgroup.wait_group(1)  # step s - 1's group retired: its slot goes back to the producer
                if s > 0:
                    pipe.consumer_release(done)
                    done.advance()
                state.advance()
            warpgroup.wait_group(0)
            if num > 0:
                pipe.consumer_release(done)
            self.store_rows(acc, thr, mdQ, mLSE, item * BLOCK, sm_scale)

    @cute.jit
    def store_rows(self, acc: cute.Tensor, thr, mdQ: cute.Tensor, mLSE: cute.Tensor, row0: Int32, sm_scale: Float32):
        """``dq[row0 + r, c] = bf16(acc * sm_scale)``; rows whose lse is -inf exactly 0."""
        cC = thr.partition_C(cute.make_identity_tensor((BLOCK, HEAD_DIM)))
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            r, c = cC[i]
            v = acc[i] * sm_scale
            if mLSE[row0 + r] == -Float32.inf:
                v = Float32(0.0)
            mdQ[row0 + r, c] = self.dtype(v)

    def fake_args(self) -> tuple:
        rows, items, width, tiles, blocks = (cute.sym_int32() for _ in range(5))
        return (fake_matrix(self.dtype, rows, HEAD_DIM, align=128), fake_vector(self.dtype, tiles, align=16),
                fake_matrix(self.dtype, rows, HEAD_DIM, align=16), fake_vector(Float32, rows, align=4),
                fake_matrix(Int32, items, width, align=4), fake_vector(Int32, items, align=4),
                fake_vector(Int32, items, align=4), fake_vector(Int32, blocks, align=4), Float32(1.0), fake_stream())
