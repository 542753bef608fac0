# SPDX-License-Identifier: Apache-2.0
"""VSA block-sparse attention forward, 128-token blocks, on mma.sync + TMA (CuTe DSL).

The GB10 (DGX Spark, sm_121a) design: one source that also compiles for sm_120a and sm_90a, since
mma.sync (m16n8k16, bf16 -> fp32) with ldmatrix and TMA exist on all three. Inference only: it
writes the output and offers no LSE variant.

What it computes, for BHSD bf16 q/k/v flattened to ``[B*H*S, 128]`` rows, ``S = T * 128``:
for query tile ``i`` of head ``bh`` that selects ``num[bh*T+i]`` key tiles
``idx[bh*T+i, 0:num)`` (``map_to_index`` layout; entries past the count are never read), every
valid row ``r < vbs[i]`` of the tile is ``softmax(q_r K^T / sqrt(128)) V`` over the first
``vbs[j]`` keys of each selected tile ``j``. Every other row (padding rows, tiles that select
nothing or only tiles with ``vbs == 0``) is written exactly zero, so the output never needs a
zero fill. Keys at or past ``vbs[j]`` are masked by selection (never by arithmetic), so padding
K/V holding NaN/Inf cannot leak; a NaN in a valid query row gives a NaN output row (the softmax
sum is tested with ``l == 0``, not ``l > 0``). Selected indices outside ``[0, T)`` count as
empty tiles.

How (two modes, :class:`~fastvideo_cute.kernels.cute.block_sparse_fwd128.Mode`):
  - one CTA per (query tile, batch*head), grid ``(T, B*H)``. ``simple_split``: 8 MMA warps (16
    query rows each) plus one TMA producer warp. ``w4r3``: 4 MMA warps (32 rows each: every K/V
    fragment read from shared memory feeds two 16-row MMAs) and no producer warp: Q and the first
    two chunks are loaded by warp 0, chunk ``c + 2``'s loads by warp ``c % 4`` (its K load after
    chunk ``c``'s softmax, when every warp has most likely released the slot), so no warp, and
    no SM sub-partition (warp 0 of both resident CTAs shares one), carries the producer's work
    every chunk; each warp reads the walk 32 entries at a time, one per lane (index and tile
    size, coalesced), and takes each chunk's entry from its lane by a shuffle, so the per-chunk
    path has no dependent global list reads (docs/pitfalls.md: uniform registers);
  - Q (128x128) arrives by TMA and stays in shared memory; its fragments are re-read (ldmatrix)
    per k-step, which keeps the registers within budget;
  - K and V stream in 64-key chunks (two 64x64 boxes, 128-byte swizzle) through two 2-deep
    mbarrier rings (TMA transaction barriers full, thread arrivals empty); every selected entry
    is two chunks; a chunk without valid keys (the second half of a tile with vbs <= 64, a tile
    with vbs 0 or an out-of-range index) is loaded from a safe address in the same head and
    skipped by the math, so producer and consumers share no skip logic;
  - per chunk: S = Q K^T (ldmatrix + mma.sync), mask keys >= valid, online softmax in
    registers (``common/softmax.py``, a row over 4 lanes), P (bf16) stays in registers as the A
    operand of O += P V (ldmatrix.trans); a chunk whose 64 keys are all valid runs a branch-free
    P V (fragment loads overlap the mma); on a partial chunk the V fragments of invalid keys are
    zeroed before the mma, since 0 * NaN would otherwise reach O;
  - the output goes registers -> shared memory (reusing Q's buffer) -> TMA store;
  - the phased walk: the n-th of each ``num_slots`` consecutive CTAs (launch order = grid
    order, tiles fastest) starts n/num_slots of the way through its selection and wraps, so
    the CTAs resident together read the key tiles they share at about the same time, while
    those are in L2. A query tile selecting more than half of the tiles walks from entry 0.
    The order depends only on the launch index, the counts and ``num_slots`` (the SM count),
    so a call is deterministic.

Shared memory: Q 32 KB + K 2x16 KB + V 2x16 KB + barriers = 96 KB + 64 B, within the GB10's
99 KB. Shapes and launch limits: ``limits.py``.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, warp, warpgroup

from fastvideo_cute.jit import CuteKernel, fake_matrix, fake_stream, fake_vector

from ..common.softmax import mask_keys, online_softmax_update, row_scale
from ..common.walk import tile_keys, walk_entry, walk_tile
from . import Mode
from .limits import BLOCK, CHUNK, HEAD_DIM, KV_STAGES, SMEM_CAPACITY


def _mn_view(t: cute.Tensor) -> cute.Tensor:
    """An m16n8 accumulator fragment ((2, 2), M, N) viewed as (rows (2, M), cols (2, N))."""
    acc_layout = t.layout
    col_major = cute.make_layout(acc_layout.shape)
    shape = ((col_major.shape[0][1], col_major.shape[1]), (col_major.shape[0][0], col_major.shape[2]))
    stride = ((col_major.stride[0][1], col_major.stride[1]), (col_major.stride[0][0], col_major.stride[2]))
    return cute.make_tensor(t.iterator, cute.composition(acc_layout, cute.make_layout(shape, stride=stride)))


def _acc_as_a_operand(t: cute.Tensor) -> cute.Tensor:
    """An m16n8 accumulator (4, M, N) viewed as the A operand of an m16n8k16 mma: ((4, 2), M, N / 2)."""
    l = cute.logical_divide(t.layout, (None, None, 2))
    layout = cute.make_layout(
        ((l.shape[0][0], l.shape[0][1], l.shape[2][0]), l.shape[1], l.shape[2][1]),
        stride=((l.stride[0][0], l.stride[0][1], l.stride[2][0]), l.stride[1], l.stride[2][1]),
    )
    return cute.make_tensor(t.iterator, layout)


class BlockSparseFwd128Sm120(CuteKernel):
    """mma.sync + TMA block-sparse forward (see the module docstring). Called (compiled) as
    ``fn(q2d, k2d, v2d, o2d, idx2d, num1d, vbs1d, num_slots)`` with torch tensors."""

    name = "block_sparse_fwd128_sm120"
    arch_family = "mma.sync+tma"
    dtype = cutlass.BFloat16

    def __init__(self, mode: str = Mode.SIMPLE_SPLIT):
        self.mode = Mode(mode)
        # w4r3: the 4 MMA warps issue the loads themselves, in turn; simple_split: a producer warp.
        self.inline_producer = self.mode is Mode.W4R3
        self.num_mma_warps = 4 if self.inline_producer else 8
        self.num_mma_threads = self.num_mma_warps * 32
        self.producer_warp = self.num_mma_warps
        self.num_threads = self.num_mma_threads + (0 if self.inline_producer else 32)
        self.kv_stages = KV_STAGES
        self.softmax_scale_log2 = (1.0 / math.sqrt(HEAD_DIM)) * math.log2(math.e)

    def config(self):
        return {"mode": self.mode.value}

    @staticmethod
    def smem_bytes() -> int:
        """Q, two K/V rings and the barriers' allowance: must fit the GB10's 99 KB."""
        return 2 * HEAD_DIM * (BLOCK + 2 * CHUNK * KV_STAGES) + 1024

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # [B*H*S, 128] bf16
        mK: cute.Tensor,
        mV: cute.Tensor,
        mO: cute.Tensor,
        mIdx: cute.Tensor,  # [B*H*T, max_kv] int32
        mNum: cute.Tensor,  # [B*H*T] int32
        mVbs: cute.Tensor,  # [T] int32
        num_slots: Int32,  # CTAs resident at once (the SM count): sets the walks' phases
        stream: cuda.CUstream,
    ):
        atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, self.dtype)
        sQ_layout = cute.tile_to_shape(atom, (BLOCK, HEAD_DIM), (0, 1))
        sKV_layout = cute.tile_to_shape(atom, (CHUNK, HEAD_DIM, self.kv_stages), (0, 1, 2))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(g2s, mQ, sQ_layout, (BLOCK, HEAD_DIM))
        kv_stage_layout = cute.select(sKV_layout, mode=[0, 1])
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, kv_stage_layout, (CHUNK, HEAD_DIM))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, kv_stage_layout, (CHUNK, HEAD_DIM))
        tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), mO, sQ_layout, (BLOCK, HEAD_DIM)
        )

        tiled_mma = cute.make_tiled_mma(
            warp.MmaF16BF16Op(self.dtype, Float32, (16, 8, 16)),
            (self.num_mma_warps, 1, 1),
            permutation_mnk=(self.num_mma_warps * 16, 16, 16),
        )

        stages = self.kv_stages

        @cute.struct
        class SharedStorage:
            mbar_q: cute.struct.MemRange[cutlass.Int64, 2]
            mbar_k: cute.struct.MemRange[cutlass.Int64, 2 * stages]
            mbar_v: cute.struct.MemRange[cutlass.Int64, 2 * stages]
            sQ: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sQ_layout)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[self.dtype, cute.cosize(sKV_layout)], 1024]

        tiles = cute.size(mVbs.shape[0])
        batch_heads = cute.size(mNum.shape[0]) // tiles
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, tma_O,
            mIdx, mNum, mVbs, num_slots, sQ_layout, sKV_layout, tiled_mma, SharedStorage,
        ).launch(
            grid=(tiles, batch_heads, 1),
            block=(self.num_threads, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
            # Registers budgeted for one CTA per SM (the GB10's shared memory holds one).
            min_blocks_per_mp=1,
        )

    # ------------------------------------------------------------------ device side
    @cute.jit
    def lane_entries(self, mIdx: cute.Tensor, mVbs: cute.Tensor, query: Int32, first: Int32, start: Int32,
                     count: Int32, tiles: Int32, lane: Int32):
        """Walk entry ``first + lane``: (its kv tile, its valid keys); (0, 0) past the walk's end."""
        e = first + lane
        kv_tile = Int32(0)
        valid = Int32(0)
        if e < count:
            kv_tile = walk_tile(mIdx, query, e, start, count)
            valid = tile_keys(mVbs, kv_tile, tiles, BLOCK)
        return kv_tile, valid

    @cute.jit
    def lane_chunk(self, lane_tile: Int32, lane_valid: Int32, c: Int32, head_chunk: Int32):
        """Chunk ``c`` from the warp's 32 lane entries (entry ``c // 2`` sits in lane ``c // 2 % 32``):
        (chunk row to load, valid keys in it, 0..64)."""
        src = (c // 2) % 32
        kv_tile = cute.arch.shuffle_sync(lane_tile, src)
        valid = cute.arch.shuffle_sync(lane_valid, src)
        return self.chunk_of(kv_tile, valid, c, head_chunk)

    @cute.jit
    def chunk_of(self, kv_tile: Int32, valid: Int32, c: Int32, head_chunk: Int32):
        """Chunk ``c`` (half ``c % 2`` of its entry's tile): (chunk row to load, valid keys, 0..64)."""
        h = c % 2
        keys = cutlass.min(cutlass.max(valid - h * CHUNK, Int32(0)), Int32(CHUNK))
        safe_tile = kv_tile if valid > 0 else Int32(0)
        return head_chunk + safe_tile * 2 + h, keys

    @cute.jit
    def walk_chunk(self, mIdx: cute.Tensor, mVbs: cute.Tensor, query: Int32, c: Int32, start: Int32,
                   count: Int32, tiles: Int32, head_chunk: Int32):
        """Chunk ``c`` of the walk (every entry is two 64-key chunks): (chunk row to load, valid keys
        in it, 0..64). A chunk without valid keys is still loaded, from a safe address in this
        head, and skipped by the math, so producer and consumers need no shared skip logic."""
        kv_tile, valid = walk_entry(mIdx, mVbs, query, c // 2, start, count, tiles, BLOCK)
        return self.chunk_of(kv_tile, valid, c, head_chunk)

    @cute.kernel
    def kernel(
        self,
        tma_atom_Q: cute.CopyAtom,
        mQ: cute.Tensor,
        tma_atom_K: cute.CopyAtom,
        mK: cute.Tensor,
        tma_atom_V: cute.CopyAtom,
        mV: cute.Tensor,
        tma_atom_O: cute.CopyAtom,
        mO: cute.Tensor,
        mIdx: cute.Tensor,
        mNum: cute.Tensor,
        mVbs: cute.Tensor,
        num_slots: Int32,
        sQ_layout: cute.ComposedLayout,
        sKV_layout: cute.ComposedLayout,
        tiled_mma: cute.TiledMma,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        tile, bh, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())

        tiles = mVbs.shape[0]
        max_kv = mIdx.shape[1]
        query = bh * tiles + tile  # also the launch index: the grid runs tiles fastest
        rows = cutlass.min(cutlass.max(mVbs[tile], Int32(0)), Int32(BLOCK))
        count = cutlass.min(cutlass.max(mNum[query], Int32(0)), max_kv)
        if rows == 0:
            count = Int32(0)
        # The phased walk's first entry (see the module docstring).
        start = Int32(0)
        if 2 * count <= tiles:
            start = (query % num_slots) * count // num_slots

        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                cpasync.prefetch_descriptor(atom)

        smem = cutlass.memory.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        sQ = storage.sQ.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)
        sK = storage.sK.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)
        sV = storage.sV.get_tensor(sKV_layout.outer, swizzle=sKV_layout.inner)

        producer = pipeline.CooperativeGroup(pipeline.Agent.Thread, 1)
        # PipelineTmaAsync's consumer_release arrives from one lane per warp: count warps.
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, self.num_mma_warps)
        q_bytes = BLOCK * HEAD_DIM * 2
        chunk_bytes = CHUNK * HEAD_DIM * 2
        pipeline_q = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_q.data_ptr(), num_stages=1, producer_group=producer,
            consumer_group=consumers, tx_count=q_bytes, defer_sync=True,
        )
        pipeline_k = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_k.data_ptr(), num_stages=self.kv_stages, producer_group=producer,
            consumer_group=consumers, tx_count=chunk_bytes, defer_sync=True,
        )
        pipeline_v = pipeline.PipelineTmaAsync.create(
            barrier_storage=storage.mbar_v.data_ptr(), num_stages=self.kv_stages, producer_group=producer,
            consumer_group=consumers, tx_count=chunk_bytes, defer_sync=True,
        )
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        loads = (tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV)
        if const_expr(self.inline_producer):
            self.consumer(tma_atom_O, mO, mIdx, mVbs, sQ, sK, sV, tiled_mma, pipeline_q, pipeline_k,
                          pipeline_v, tidx, bh, tile, query, rows, count, start, tiles, loads)
        else:
            if warp_idx == self.producer_warp:
                self.producer(loads, mIdx, mVbs, pipeline_q, pipeline_k, pipeline_v, bh, query, count, start, tiles)
            else:
                self.consumer(tma_atom_O, mO, mIdx, mVbs, sQ, sK, sV, tiled_mma, pipeline_q, pipeline_k,
                              pipeline_v, tidx, bh, tile, query, rows, count, start, tiles, loads)

    @cute.jit
    def tma_views(self, loads):
        """TMA partitions of Q (by query tile) and K/V (by 64-key chunk row) for the issuing thread."""
        tma_atom_Q, mQ, tma_atom_K, mK, tma_atom_V, mV, sQ, sK, sV = loads
        unit = cute.make_layout(1)
        gQ = cute.local_tile(mQ, (BLOCK, HEAD_DIM), (None, 0))  # (128, 128, q tiles)
        gK = cute.local_tile(mK, (CHUNK, HEAD_DIM), (None, 0))  # (64, 128, chunks)
        gV = cute.local_tile(mV, (CHUNK, HEAD_DIM), (None, 0))
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, unit, cute.group_modes(sQ, 0, 2),
                                           cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, unit, cute.group_modes(sK, 0, 2),
                                           cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, unit, cute.group_modes(sV, 0, 2),
                                           cute.group_modes(gV, 0, 2))
        return tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV

    @cute.jit
    def load_q(self, tma_atom_Q, tQgQ, tQsQ, pipeline_q, query):
        q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, 1)
        pipeline_q.producer_acquire(q_state)
        cute.copy(tma_atom_Q, tQgQ[None, query], tQsQ, tma_bar_ptr=pipeline_q.producer_get_barrier(q_state))

    @cute.jit
    def producer(self, loads, mIdx, mVbs, pipeline_q, pipeline_k, pipeline_v, bh, query, count, start, tiles):
        """The producer warp (one lane): Q, then every chunk of the walk, K before V."""
        tma_atom_Q, _, tma_atom_K, _, tma_atom_V, _, _, _, _ = loads
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tma_views(loads)
        if count > 0:
            self.load_q(tma_atom_Q, tQgQ, tQsQ, pipeline_q, query)
        head_chunk = bh * tiles * 2
        for c in cutlass.range(2 * count, unroll=1):
            self.load_chunk(tma_atom_K, tKgK, tKsK, pipeline_k, mIdx, mVbs, query, c, start, count, tiles, head_chunk)
            self.load_chunk(tma_atom_V, tVgV, tVsV, pipeline_v, mIdx, mVbs, query, c, start, count, tiles, head_chunk)

    def _producer_state(self, n: Int32):
        """The producer's ring position for its n-th load (computed, not carried: the inline
        producer is MMA warp 0, and a stateless position keeps its code branch-local)."""
        return pipeline.PipelineState(self.kv_stages, n, n % self.kv_stages, ((n // self.kv_stages) % 2) ^ 1)

    @cute.jit
    def load_chunk(self, tma_atom, tXgX, tXsX, pipe, mIdx, mVbs, query, c, start, count, tiles, head_chunk):
        """Chunk ``c`` of the walk into its ring slot (K or V: the atom, views and pipeline say which)."""
        chunk, _ = self.walk_chunk(mIdx, mVbs, query, c, start, count, tiles, head_chunk)
        self.issue_chunk(tma_atom, tXgX, tXsX, pipe, chunk, c)

    @cute.jit
    def issue_chunk(self, tma_atom, tXgX, tXsX, pipe, chunk, c):
        """The TMA load of chunk row ``chunk`` as the walk's ``c``-th chunk (into its ring slot)."""
        state = self._producer_state(c)
        pipe.producer_acquire(state)
        cute.copy(tma_atom, tXgX[None, chunk], tXsX[None, state.index], tma_bar_ptr=pipe.producer_get_barrier(state))

    @cute.jit
    def consumer(self, tma_atom_O, mO, mIdx, mVbs, sQ, sK, sV, tiled_mma, pipeline_q, pipeline_k,
                 pipeline_v, tidx, bh, tile, query, rows, count, start, tiles, loads):
        thr_mma = tiled_mma.get_slice(tidx)
        # V^T views: (head_dim, keys, stage), the B operand of O += P V.
        sVt = cute.make_tensor(sV.iterator, cute.select(sV.layout, mode=[1, 0, 2]))

        tSrQ = thr_mma.make_fragment_A(thr_mma.partition_A(sQ))
        tSrK = thr_mma.make_fragment_B(thr_mma.partition_B(sK[None, None, 0]))
        tOrVt = thr_mma.make_fragment_B(thr_mma.partition_B(sVt[None, None, 0]))
        acc_O = cute.make_rmem_tensor(thr_mma.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        acc_O.fill(0.0)
        acc_S_shape = thr_mma.partition_shape_C((BLOCK, CHUNK))

        ldsm = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        ldsm_t = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=True, num_matrices=4), self.dtype)
        thr_copy_Q = cute.make_tiled_copy_A(ldsm, tiled_mma).get_slice(tidx)
        thr_copy_K = cute.make_tiled_copy_B(ldsm, tiled_mma).get_slice(tidx)
        thr_copy_V = cute.make_tiled_copy_B(ldsm_t, tiled_mma).get_slice(tidx)
        tSsQ = thr_copy_Q.partition_S(sQ)
        tSsK = thr_copy_K.partition_S(sK)
        tOsVt = thr_copy_V.partition_S(sVt)
        tSrQ_view = thr_copy_Q.retile(tSrQ)
        tSrK_view = thr_copy_K.retile(tSrK)
        tOrVt_view = thr_copy_V.retile(tOrVt)

        # Coordinates of the fragments' elements: key columns of S, key rows of V^T, rows of O.
        tScS = thr_mma.partition_C(cute.make_identity_tensor((BLOCK, CHUNK)))
        tOcVt = thr_mma.partition_B(cute.make_identity_tensor((HEAD_DIM, CHUNK)))
        tOcO_mn = _mn_view(thr_mma.partition_C(cute.make_identity_tensor((BLOCK, HEAD_DIM))))

        acc_O_mn = _mn_view(acc_O)
        num_rows = cute.size(acc_O_mn, mode=[0])
        row_max = cute.make_rmem_tensor((num_rows,), Float32)
        row_sum = cute.make_rmem_tensor((num_rows,), Float32)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        scale_log2 = Float32(self.softmax_scale_log2)

        tma_atom_Q, _, tma_atom_K, _, tma_atom_V, _, _, _, _ = loads
        tQsQ, tQgQ, tKsK, tKgK, tVsV, tVgV = self.tma_views(loads)
        warp_idx = cute.arch.make_warp_uniform(tidx // 32)
        head_chunk = bh * tiles * 2
        total = 2 * count
        stages = self.kv_stages
        if const_expr(self.inline_producer):
            # Warp 0 issues Q and the first `stages` chunks (the DSL elects one lane for the barrier
            # arrive and the TMA issue; calling them from one lane would deadlock elect.sync); the
            # loads of chunk c + stages come from warp c % 4 once every warp has released chunk c's
            # stage (in the loop below).
            if warp_idx == 0:
                if count > 0:
                    self.load_q(tma_atom_Q, tQgQ, tQsQ, pipeline_q, query)
                for c in cutlass.range(cutlass.min(total, Int32(stages)), unroll=1):
                    self.load_chunk(tma_atom_K, tKgK, tKsK, pipeline_k, mIdx, mVbs, query, c, start, count, tiles,
                                head_chunk)
                    self.load_chunk(tma_atom_V, tVgV, tVsV, pipeline_v, mIdx, mVbs, query, c, start, count, tiles,
                                head_chunk)

        if count > 0:
            # Q stays in shared memory: its fragments are re-read per k-step, which keeps the
            # registers within budget (8 warps: the 168 that 9 warps allow; 4 warps: 255).
            q_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, 1)
            pipeline_q.consumer_wait(q_state)

        k_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
        v_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, stages)
        num_k_blocks = cute.size(tSrQ, mode=[2])
        num_pv_k_blocks = cute.size(tOrVt, mode=[2])
        inline = const_expr(self.inline_producer)
        # The walk's list reads (index, then that tile's size: two dependent global loads) run ahead
        # of the math, so their latency overlaps a chunk's math instead of starting it: one chunk
        # ahead (simple_split), or two, from the 32 entries the lanes hold (w4r3), where the chunk
        # row also feeds that chunk's loads.
        keys_2nd = Int32(0)
        lane = tidx % 32
        lane_tile = Int32(0)  # (w4r3) entry 32 * j + lane of the walk: its tile and valid keys
        lane_valid = Int32(0)
        if const_expr(inline):
            keys = Int32(0)
            if total > 0:  # (no list read at all for a query tile without entries)
                lane_tile, lane_valid = self.lane_entries(mIdx, mVbs, query, Int32(0), start, count, tiles, lane)
                _, keys = self.lane_chunk(lane_tile, lane_valid, Int32(0), head_chunk)
                _, keys_2nd = self.lane_chunk(lane_tile, lane_valid, Int32(1), head_chunk)
        else:
            _, keys = self.walk_chunk(mIdx, mVbs, query, Int32(0), start, count, tiles, head_chunk)
        for c in cutlass.range(total, unroll=1):
            # (past the last chunk these re-read the last entry: harmless cached loads, no branch)
            row_ahead = Int32(0)
            keys_next = Int32(0)
            if const_expr(inline):
                # chunk c + 2 starts the next 32 entries: the lanes read them (warp-uniform branch)
                if (c + 2) % 64 == 0 and c + 2 < total:
                    lane_tile, lane_valid = self.lane_entries(mIdx, mVbs, query, (c + 2) // 2, start, count, tiles,
                                                              lane)
                row_ahead, keys_next = self.lane_chunk(lane_tile, lane_valid, c + 2, head_chunk)
            else:
                row_ahead, keys_next = self.walk_chunk(mIdx, mVbs, query, cutlass.min(c + 1, total - 1), start,
                                                       count, tiles, head_chunk)
            loader = Int32(0)  # the warp that issues chunk c + stages's loads (w4r3)
            if const_expr(inline):
                loader = c % self.num_mma_warps
            # ---- S = Q K^T
            acc_S = cute.make_rmem_tensor(acc_S_shape, Float32)
            pipeline_k.consumer_wait(k_state)
            if keys > 0:
                acc_S.fill(0.0)
                tSsK_cur = tSsK[None, None, None, k_state.index]
                cute.copy(thr_copy_Q, tSsQ[None, None, 0], tSrQ_view[None, None, 0])
                cute.copy(thr_copy_K, tSsK_cur[None, None, 0], tSrK_view[None, None, 0])
                for k in cutlass.range_constexpr(num_k_blocks):
                    if const_expr(k + 1 < num_k_blocks):
                        cute.copy(thr_copy_Q, tSsQ[None, None, k + 1], tSrQ_view[None, None, k + 1])
                        cute.copy(thr_copy_K, tSsK_cur[None, None, k + 1], tSrK_view[None, None, k + 1])
                    cute.gemm(tiled_mma, acc_S, tSrQ[None, None, k], tSrK[None, None, k], acc_S)
            pipeline_k.consumer_release(k_state)
            if keys > 0:
                # ---- mask keys at or past the chunk's valid count (a select: NaN scores go too)
                if keys < CHUNK:
                    mask_keys(acc_S, tScS, keys)
                # ---- online softmax (a row spans 4 lanes), P in registers
                acc_S_mn = _mn_view(acc_S)
                for r in cutlass.range_constexpr(num_rows):
                    _, new_max, new_sum, alpha = online_softmax_update(
                        acc_S_mn[r, None].load(), row_max[r], row_sum[r], scale_log2, threads_in_group=4,
                        p_out=acc_S_mn[r, None])
                    row_max[r] = new_max
                    row_sum[r] = new_sum
                    acc_O_mn[r, None].store(acc_O_mn[r, None].load() * alpha)
            if const_expr(inline):
                if warp_idx == loader and c + stages < total:
                    self.issue_chunk(tma_atom_K, tKgK, tKsK, pipeline_k, row_ahead, c + stages)
            rP = cute.make_rmem_tensor(acc_S_shape, self.dtype)
            tOrP = _acc_as_a_operand(rP)
            # ---- O += P V
            pipeline_v.consumer_wait(v_state)
            if keys > 0:
                rP.store(acc_S.load().to(self.dtype))
                tOsVt_cur = tOsVt[None, None, None, v_state.index]
                if keys == CHUNK:
                    # every key valid: no masking, and the next fragments load while this mma runs
                    cute.copy(thr_copy_V, tOsVt_cur[None, None, 0], tOrVt_view[None, None, 0])
                    for k in cutlass.range_constexpr(num_pv_k_blocks):
                        if const_expr(k + 1 < num_pv_k_blocks):
                            cute.copy(thr_copy_V, tOsVt_cur[None, None, k + 1], tOrVt_view[None, None, k + 1])
                        cute.gemm(tiled_mma, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)
                else:
                    for k in cutlass.range_constexpr(num_pv_k_blocks):
                        cute.copy(thr_copy_V, tOsVt_cur[None, None, k], tOrVt_view[None, None, k])
                        if keys < CHUNK:
                            # P is 0 past the valid keys, but 0 * NaN in V's padding rows is NaN.
                            tOrVt_k = tOrVt[None, None, k]
                            tOcVt_k = tOcVt[None, None, k]
                            for i in cutlass.range_constexpr(cute.size(tOrVt_k)):
                                if tOcVt_k[i][1] >= keys:
                                    tOrVt_k[i] = self.dtype(0.0)
                        cute.gemm(tiled_mma, acc_O, tOrP[None, None, k], tOrVt[None, None, k], acc_O)
            pipeline_v.consumer_release(v_state)
            if const_expr(inline):
                if warp_idx == loader and c + stages < total:
                    self.issue_chunk(tma_atom_V, tVgV, tVsV, pipeline_v, row_ahead, c + stages)
            k_state.advance()
            v_state.advance()
            if const_expr(inline):
                keys = keys_2nd
                keys_2nd = keys_next
            else:
                keys = keys_next

        # ---- epilogue: normalise, zero the rows without keys and the padding rows
        for r in cutlass.range_constexpr(num_rows):
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            row_idx = tOcO_mn[r, 0][0]
            # l == 0: no valid key. A NaN sum (NaN query row) is kept, so the row comes out NaN.
            inv, empty = row_scale(total)
            keep = (not empty) and row_idx < rows
            for c in cutlass.range_constexpr(cute.size(acc_O_mn, mode=[1])):
                acc_O_mn[r, c] = acc_O_mn[r, c] * inv if keep else Float32(0.0)
        rO = cute.make_rmem_tensor_like(acc_O, self.dtype)
        rO.store(acc_O.load().to(self.dtype))
        sO = sQ  # every warp read only its own Q rows into registers, and writes only those rows of O
        st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), self.dtype, num_bits_per_copy=32)
        thr_copy_O = cute.make_tiled_copy_C(st_atom, tiled_mma).get_slice(tidx)
        cute.copy(thr_copy_O, thr_copy_O.retile(rO), thr_copy_O.partition_D(sO))
        cute.arch.fence_view_async_shared()
        cute.arch.barrier(barrier_id=1, number_of_threads=self.num_mma_threads)
        if tidx < 32:
            gO = cute.local_tile(mO, (BLOCK, HEAD_DIM), (None, 0))
            tOsO, tOgO = cpasync.tma_partition(tma_atom_O, 0, cute.make_layout(1), cute.group_modes(sO, 0, 2),
                                               cute.group_modes(gO, 0, 2))
            cute.copy(tma_atom_O, tOsO, tOgO[None, query])
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    # ------------------------------------------------------------------ compilation
    def fake_args(self) -> tuple:
        """Fake (tensor-free) arguments of ``__call__``: dynamic row/tile/list sizes."""
        rows = cute.sym_int32()
        bht, max_kv, tiles = cute.sym_int32(), cute.sym_int32(), cute.sym_int32()

        def rows_x_dim():
            return fake_matrix(self.dtype, rows, HEAD_DIM, align=16)

        idx = fake_matrix(Int32, bht, max_kv, align=4)
        num = fake_vector(Int32, bht, align=4)
        vbs = fake_vector(Int32, tiles, align=4)
        return (rows_x_dim(), rows_x_dim(), rows_x_dim(), rows_x_dim(), idx, num, vbs, Int32(1), fake_stream())


assert BlockSparseFwd128Sm120.smem_bytes() <= SMEM_CAPACITY, "exceeds the GB10's 99 KB of shared memory"
