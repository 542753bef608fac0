# SPDX-License-Identifier: Apache-2.0
"""VSA block-sparse attention backward, 64-token blocks: the tcgen05 main kernel (sm_100a).

Stage 3 of seed 000's chain (preprocess -> work order -> main -> postprocess). One CTA per kv work
item ``(b*H + h) * nb + kv`` (through the work order), 128 threads (4 warps); K and V (64 x 128)
stay in shared memory, and the item's k2q list of q blocks is walked two q blocks at a time, so
every MMA has M = 128 (a single-CTA tcgen05 tile, one accumulator row per thread and TMEM lane):

    S    [q 128 x kv 64]  = Q_pair  K^T          (A = Q  K-major,   B = K  K-major)
    dP   [q 128 x kv 64]  = dO_pair V^T          (A = dO K-major,   B = V  K-major)
    P    = exp2(S * scale_log2 - lse2[q]),  keys >= size -> 0 (select);   dS = P * (dP - delta[q])
    dV^T [hd 128 x kv 64] += dO_pair^T P         (A = dO MN-major,  B = P  MN-major)
    dK^T [hd 128 x kv 64] += Q_pair^T dS         (A = Q  MN-major,  B = dS MN-major)
    dQ   [q 128 x hd 128]  = dS K                (A = dS K-major,   B = K  MN-major)
    dq_accum[q rows] += dQ                       (fp32 cp.reduce.async.bulk, 32 KB per q block)

Accumulators live in tensor memory (S 64 + dP 64 + dV^T 64 + dK^T 64 + dQ 128 of 512 columns),
read back with tcgen05.ld (32x32b: thread t holds row t). Q/dO pairs arrive by TMA (64 x 64 boxes,
128-byte swizzle; the MN-major operand views are the same bytes, FA4's sm100 backward idiom). The
second half of an odd tail pair reloads the first q block and runs with lse2 = +inf (P = dS = 0),
and its dQ rows are not reduced. Keys at or past ``kv_block_sizes[kv]`` are masked by selection,
and K's padded rows are zeroed in shared memory before dQ = dS K (0 * NaN would leak); dk/dv rows
of padded keys are written as exact zeros. Items with an empty list are skipped (the preprocess
zeroed their dk/dv rows). lse2 (log2 domain, +inf for rows with no valid key) and delta come from
the preprocess; dk carries sm_scale, dq gets it in the postprocess.

Serial within a CTA (load -> S/dP -> softmax -> dV/dK/dQ -> dQ drain), single stage: the
correctness-first version; several CTAs per SM overlap each other's phases. STATUS: compiles for
sm_100a (UTCHMMA, LDTM, UTMALDG in the SASS); not yet run on a GPU. Shapes and launch limits:
``limits.py``.
"""

from __future__ import annotations

import math

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import cpasync, tcgen05, warpgroup
from cutlass.tensor_utils import LayoutEnum

from fastvideo_cute.jit import CuteKernel

from ..common.bulk import bulk_reduce_add_f32
from ..common.tcgen05 import fence_after, fence_before
from .block_sparse_bwd64_common import main_fake_args
from .limits import BLOCK, HEAD_DIM

PAIR = 2 * BLOCK  # q rows per MMA tile
LOG2E = math.log2(math.e)

# TMEM columns
TMEM_S, TMEM_DP, TMEM_DV, TMEM_DK, TMEM_DQ = 0, 64, 128, 192, 256
TMEM_COLS = 512
CHUNK = 32  # TMEM columns per tcgen05.ld


_bulk_reduce_add_f32 = bulk_reduce_add_f32


def _gemm(tiled_mma: cute.TiledMma, acc: cute.Tensor, tA: cute.Tensor, tB: cute.Tensor, accumulate):
    """acc (+)= A B over the K blocks of the fragments (modes (MMA, M, K))."""
    atom = cute.make_mma_atom(tiled_mma.op)
    for k in range(cute.size(tA.shape[2])):  # plain Python: this helper is not preprocessed
        if k == 0:
            atom.set(tcgen05.Field.ACCUMULATE, accumulate)
        else:
            atom.set(tcgen05.Field.ACCUMULATE, True)
        cute.gemm(atom, acc, tA[None, None, k], tB[None, None, k], acc)


class BlockSparseBwd64Sm100(CuteKernel):
    """tcgen05 main kernel of the 64-token VSA backward (see the module docstring). Called
    (compiled) as ``fn(q2d, k2d, v2d, do2d, dk2d, dv2d, dqacc2d, lse2, delta, idx2d, num, vbs,
    order, sm_scale)``."""

    name = "block_sparse_bwd64_sm100"
    arch_family = "tcgen05"

    def __init__(self):
        self.dtype = cutlass.BFloat16
        self.num_threads = 128

    def config(self):
        return {}

    # ------------------------------------------------------------------ host side
    def make_mmas_and_layouts(self) -> dict:
        """The five tiled MMAs and the shared-memory layouts (call inside a JIT context). Several
        operand views share one buffer: sQ / sQt (Q pair as A of S, K-major, and as A of dK^T,
        MN-major), sK / sKt, sP / sPt, and the TMA box layouts address the same bytes; the CPU test
        checks these identities element by element."""
        bf = self.dtype
        K_MAJ, MN_MAJ = cute.nvgpu.OperandMajorMode.K, cute.nvgpu.OperandMajorMode.MN
        one = tcgen05.CtaGroup.ONE
        mma_S = sm100_utils.make_trivial_tiled_mma(bf, bf, K_MAJ, K_MAJ, Float32, one, (PAIR, BLOCK))
        mma_dP = sm100_utils.make_trivial_tiled_mma(bf, bf, K_MAJ, K_MAJ, Float32, one, (PAIR, BLOCK))
        mma_dV = sm100_utils.make_trivial_tiled_mma(bf, bf, MN_MAJ, MN_MAJ, Float32, one, (HEAD_DIM, BLOCK))
        mma_dK = sm100_utils.make_trivial_tiled_mma(bf, bf, MN_MAJ, MN_MAJ, Float32, one, (HEAD_DIM, BLOCK))
        mma_dQ = sm100_utils.make_trivial_tiled_mma(bf, bf, K_MAJ, MN_MAJ, Float32, one, (PAIR, HEAD_DIM))

        tiler_S = (PAIR, BLOCK, HEAD_DIM)
        tiler_dKV = (HEAD_DIM, BLOCK, PAIR)
        tiler_dQ = (PAIR, HEAD_DIM, BLOCK)
        # Q pair / dO pair [128 q, 128 hd]: A of S/dP (K-major) and A of dK^T/dV^T (MN-major).
        sQ_layout = cute.slice_(sm100_utils.make_smem_layout_a(mma_S, tiler_S, bf, 1), (None, None, None, 0))
        sQt_layout = cute.slice_(sm100_utils.make_smem_layout_a(mma_dK, tiler_dKV, bf, 1), (None, None, None, 0))
        # K / V [64 kv, 128 hd]: B of S/dP (K-major); K also B of dQ (MN-major).
        sK_layout = cute.slice_(sm100_utils.make_smem_layout_b(mma_S, tiler_S, bf, 1), (None, None, None, 0))
        sKt_layout = cute.slice_(sm100_utils.make_smem_layout_b(mma_dQ, tiler_dQ, bf, 1), (None, None, None, 0))
        # P / dS [128 q, 64 kv]: A of dQ (K-major) and B of dV^T/dK^T (MN-major).
        sP_layout = cute.slice_(sm100_utils.make_smem_layout_a(mma_dQ, tiler_dQ, bf, 1), (None, None, None, 0))
        sPt_layout = cute.slice_(sm100_utils.make_smem_layout_b(mma_dK, tiler_dKV, bf, 1), (None, None, None, 0))
        # TMA boxes: 64 rows x 64 columns (128 B) of a [R, 128] tensor, 128-byte swizzle; a q pair
        # tile is four boxes (box (half h, column slab s) at stage h + 2 s), a K/V tile two.
        box_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, bf)
        box_pair = cute.tile_to_shape(box_atom, (BLOCK, 64, 4), (0, 1, 2))
        box_kv = cute.tile_to_shape(box_atom, (BLOCK, 64, 2), (0, 1, 2))

        sPe = cute.slice_(sm100_utils.make_smem_layout_epi(bf, LayoutEnum.ROW_MAJOR, (PAIR, BLOCK), 1).outer,
                          (None, None, 0))
        return dict(mma_S=mma_S, mma_dP=mma_dP, mma_dV=mma_dV, mma_dK=mma_dK, mma_dQ=mma_dQ,
                    sQ=sQ_layout, sQt=sQt_layout, sK=sK_layout, sKt=sKt_layout, sP=sP_layout, sPt=sPt_layout,
                    box_pair=box_pair, box_kv=box_kv, sPe=sPe)

    @cute.jit
    def __call__(
        self,
        mQ: cute.Tensor,  # [R, 128] bf16, R = B*H*S
        mK: cute.Tensor,
        mV: cute.Tensor,
        mdO: cute.Tensor,
        mdK: cute.Tensor,  # [R, 128] bf16 (out; rows of selected kv blocks)
        mdV: cute.Tensor,
        mdQaccum: cute.Tensor,  # [R, 128] fp32 (reduce-add)
        mLSE2: cute.Tensor,  # [R] fp32 (preprocess)
        mDelta: cute.Tensor,  # [R] fp32 (preprocess)
        mIdx: cute.Tensor,  # [B*H*nb, max_q] int32 (k2q)
        mNum: cute.Tensor,  # [B*H*nb] int32
        mVbs: cute.Tensor,  # [nb] int32
        mOrder: cute.Tensor,  # [B*H*nb] int32: work id -> item
        sm_scale: Float32,
        stream: cuda.CUstream,
    ):
        L = self.make_mmas_and_layouts()
        mma_S, mma_dP, mma_dV, mma_dK, mma_dQ = L["mma_S"], L["mma_dP"], L["mma_dV"], L["mma_dK"], L["mma_dQ"]
        sQ_layout, sQt_layout, sK_layout, sKt_layout = L["sQ"], L["sQt"], L["sK"], L["sKt"]
        sP_layout, sPt_layout, box_pair, box_kv = L["sP"], L["sPt"], L["box_pair"], L["box_kv"]
        box_one = cute.select(box_kv, mode=[0, 1])
        bf = self.dtype

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(g2s, mQ, box_one, (BLOCK, 64))
        tma_atom_dO, tma_dO = cpasync.make_tiled_tma_atom(g2s, mdO, box_one, (BLOCK, 64))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, box_one, (BLOCK, 64))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, box_one, (BLOCK, 64))

        @cute.struct
        class SharedStorage:
            mbar_tma: cute.struct.MemRange[cutlass.Int64, 1]
            mbar_kv: cute.struct.MemRange[cutlass.Int64, 1]
            mbar_mma: cute.struct.MemRange[cutlass.Int64, 1]
            tmem_holding: cute.struct.MemRange[Int32, 1]
            sQ: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(box_pair)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(box_pair)], 1024]
            sK: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(box_kv)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(box_kv)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(sP_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(sP_layout)], 1024]
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, PAIR * HEAD_DIM], 128]

        num_items = cute.size(mNum.shape[0])
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V, tma_V,
            mK, mdK, mdV, mdQaccum, mLSE2, mDelta, mIdx, mNum, mVbs, mOrder, sm_scale,
            mma_S, mma_dP, mma_dV, mma_dK, mma_dQ,
            sQ_layout, sQt_layout, sK_layout, sKt_layout, sP_layout, sPt_layout, box_pair, box_kv,
            SharedStorage,
        ).launch(
            grid=(num_items, 1, 1),
            block=(self.num_threads, 1, 1),
            smem=SharedStorage.size_in_bytes(),
            stream=stream,
        )

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(
        self,
        tma_atom_Q: cute.CopyAtom,
        tma_Q: cute.Tensor,
        tma_atom_dO: cute.CopyAtom,
        tma_dO: cute.Tensor,
        tma_atom_K: cute.CopyAtom,
        tma_K: cute.Tensor,
        tma_atom_V: cute.CopyAtom,
        tma_V: cute.Tensor,
        mK: cute.Tensor,
        mdK: cute.Tensor,
        mdV: cute.Tensor,
        mdQaccum: cute.Tensor,
        mLSE2: cute.Tensor,
        mDelta: cute.Tensor,
        mIdx: cute.Tensor,
        mNum: cute.Tensor,
        mVbs: cute.Tensor,
        mOrder: cute.Tensor,
        sm_scale: Float32,
        mma_S: cute.TiledMma,
        mma_dP: cute.TiledMma,
        mma_dV: cute.TiledMma,
        mma_dK: cute.TiledMma,
        mma_dQ: cute.TiledMma,
        sQ_layout: cute.ComposedLayout,
        sQt_layout: cute.ComposedLayout,
        sK_layout: cute.ComposedLayout,
        sKt_layout: cute.ComposedLayout,
        sP_layout: cute.ComposedLayout,
        sPt_layout: cute.ComposedLayout,
        box_pair: cute.ComposedLayout,
        box_kv: cute.ComposedLayout,
        SharedStorage: cutlass.Constexpr,
    ):
        tidx, _, _ = cute.arch.thread_idx()
        work, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        nb = cute.size(mVbs.shape[0])
        item = mOrder[work]
        bh = item // nb
        kv = item - bh * nb
        count = mNum[item]
        size = cutlass.min(cutlass.max(mVbs[kv], Int32(0)), Int32(BLOCK))

        if warp_idx == 0:
            cpasync.prefetch_descriptor(tma_atom_Q)
            cpasync.prefetch_descriptor(tma_atom_dO)
            cpasync.prefetch_descriptor(tma_atom_K)
            cpasync.prefetch_descriptor(tma_atom_V)

        smem = cutlass.utils.SmemAllocator()
        storage = smem.allocate(SharedStorage)
        mbar_tma = storage.mbar_tma.data_ptr()
        mbar_kv = storage.mbar_kv.data_ptr()
        mbar_mma = storage.mbar_mma.data_ptr()
        if tidx == 0:
            cute.arch.mbarrier_init(mbar_tma, 1)
            cute.arch.mbarrier_init(mbar_kv, 1)
            cute.arch.mbarrier_init(mbar_mma, 1)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()

        if count > 0:
            self.process(
                tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V, tma_V,
                mdK, mdV, mdQaccum, mLSE2, mDelta, mIdx, sm_scale,
                mma_S, mma_dP, mma_dV, mma_dK, mma_dQ,
                sQ_layout, sQt_layout, sK_layout, sKt_layout, sP_layout, sPt_layout, box_pair, box_kv,
                storage, mbar_tma, mbar_kv, mbar_mma, tidx, warp_idx, item, bh, kv, nb, count, size,
            )

    @cute.jit
    def process(
        self, tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V, tma_V,
        mdK, mdV, mdQaccum, mLSE2, mDelta, mIdx, sm_scale,
        mma_S, mma_dP, mma_dV, mma_dK, mma_dQ,
        sQ_layout, sQt_layout, sK_layout, sKt_layout, sP_layout, sPt_layout, box_pair, box_kv,
        storage, mbar_tma, mbar_kv, mbar_mma, tidx, warp_idx, item, bh, kv, nb, count, size,
    ):
        bf = self.dtype
        # ---- shared memory views (one buffer, several operand views)
        sQ_box = storage.sQ.get_tensor(box_pair.outer, swizzle=box_pair.inner)
        sdO_box = storage.sdO.get_tensor(box_pair.outer, swizzle=box_pair.inner)
        sK_box = storage.sK.get_tensor(box_kv.outer, swizzle=box_kv.inner)
        sV_box = storage.sV.get_tensor(box_kv.outer, swizzle=box_kv.inner)
        sQ = cute.make_tensor(cute.recast_ptr(sQ_box.iterator, sQ_layout.inner, dtype=bf), sQ_layout.outer)
        sQt = cute.make_tensor(cute.recast_ptr(sQ_box.iterator, sQt_layout.inner, dtype=bf), sQt_layout.outer)
        sdO = cute.make_tensor(cute.recast_ptr(sdO_box.iterator, sQ_layout.inner, dtype=bf), sQ_layout.outer)
        sdOt = cute.make_tensor(cute.recast_ptr(sdO_box.iterator, sQt_layout.inner, dtype=bf), sQt_layout.outer)
        sK = cute.make_tensor(cute.recast_ptr(sK_box.iterator, sK_layout.inner, dtype=bf), sK_layout.outer)
        sKt = cute.make_tensor(cute.recast_ptr(sK_box.iterator, sKt_layout.inner, dtype=bf), sKt_layout.outer)
        sV = cute.make_tensor(cute.recast_ptr(sV_box.iterator, sK_layout.inner, dtype=bf), sK_layout.outer)
        sP = storage.sP.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
        sPt = cute.make_tensor(cute.recast_ptr(sP.iterator, sPt_layout.inner, dtype=bf), sPt_layout.outer)
        sdS = storage.sdS.get_tensor(sP_layout.outer, swizzle=sP_layout.inner)
        sdSt = cute.make_tensor(cute.recast_ptr(sdS.iterator, sPt_layout.inner, dtype=bf), sPt_layout.outer)
        sdQ = storage.sdQ.get_tensor(cute.make_layout((PAIR, HEAD_DIM), stride=(HEAD_DIM, 1)))
        # P / dS as the row-major (128 q, 64 kv) epilogue tile (q * 64 + kv, 128-byte swizzle: the
        # bytes the MMA views read), rank 3 like the TMEM fragment, for the register -> smem copy.
        sPe_layout = self.make_mmas_and_layouts()["sPe"]
        sPe_layout = cute.make_layout((sPe_layout.shape, 1, 1), stride=(sPe_layout.stride, 0, 0))
        sP_epi = cute.make_tensor(sP.iterator, sPe_layout)
        sdS_epi = cute.make_tensor(sdS.iterator, sPe_layout)

        # ---- TMA partitions
        unit = cute.make_layout(1)
        gQ = cute.local_tile(tma_Q, (BLOCK, 64), (None, None))  # (64, 64, row blocks, 2)
        gdO = cute.local_tile(tma_dO, (BLOCK, 64), (None, None))
        gK = cute.local_tile(tma_K, (BLOCK, 64), (None, None))
        gV = cute.local_tile(tma_V, (BLOCK, 64), (None, None))
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, unit, cute.group_modes(sQ_box, 0, 2), cute.group_modes(gQ, 0, 2))
        tOsO, tOgO = cpasync.tma_partition(tma_atom_dO, 0, unit, cute.group_modes(sdO_box, 0, 2), cute.group_modes(gdO, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, unit, cute.group_modes(sK_box, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, unit, cute.group_modes(sV_box, 0, 2), cute.group_modes(gV, 0, 2))

        # ---- tensor memory
        tmem_barrier = pipeline.NamedBarrier(barrier_id=1, num_threads=self.num_threads)
        tmem = cutlass.utils.TmemAllocator(storage.tmem_holding.data_ptr(), barrier_for_retrieve=tmem_barrier,
                                           allocator_warp_id=0)
        tmem.allocate(TMEM_COLS)
        tmem.wait_for_alloc()
        tmem_ptr = tmem.retrieve_ptr(Float32)

        thr_S = mma_S.get_slice(0)
        thr_dP = mma_dP.get_slice(0)
        thr_dV = mma_dV.get_slice(0)
        thr_dK = mma_dK.get_slice(0)
        thr_dQ = mma_dQ.get_slice(0)
        tStS = cute.make_tensor(tmem_ptr + TMEM_S, thr_S.make_fragment_C(thr_S.partition_shape_C((PAIR, BLOCK))).layout)
        tdPtdP = cute.make_tensor(tmem_ptr + TMEM_DP, thr_dP.make_fragment_C(thr_dP.partition_shape_C((PAIR, BLOCK))).layout)
        tdVtdV = cute.make_tensor(tmem_ptr + TMEM_DV, thr_dV.make_fragment_C(thr_dV.partition_shape_C((HEAD_DIM, BLOCK))).layout)
        tdKtdK = cute.make_tensor(tmem_ptr + TMEM_DK, thr_dK.make_fragment_C(thr_dK.partition_shape_C((HEAD_DIM, BLOCK))).layout)
        tdQtdQ = cute.make_tensor(tmem_ptr + TMEM_DQ, thr_dQ.make_fragment_C(thr_dQ.partition_shape_C((PAIR, HEAD_DIM))).layout)

        # MMA operand fragments (smem descriptors)
        tSrQ = mma_S.make_fragment_A(sQ)
        tSrK = mma_S.make_fragment_B(sK)
        tdPrdO = mma_dP.make_fragment_A(sdO)
        tdPrV = mma_dP.make_fragment_B(sV)
        tdVrdOt = mma_dV.make_fragment_A(sdOt)
        tdVrP = mma_dV.make_fragment_B(sPt)
        tdKrQt = mma_dK.make_fragment_A(sQt)
        tdKrdS = mma_dK.make_fragment_B(sdSt)
        tdQrdS = mma_dQ.make_fragment_A(sdS)
        tdQrKt = mma_dQ.make_fragment_B(sKt)

        # tcgen05.ld: thread t reads TMEM lane t (row t of every accumulator), 32 columns a load
        # (mode 1 of the partitions walks the 32-column chunks, so few registers are live)
        ld32 = cute.make_copy_atom(tcgen05.copy.Ld32x32bOp(tcgen05.copy.Repetition(CHUNK)), Float32)
        tiled_t2r_S = tcgen05.make_tmem_copy(ld32, tStS)
        t2r_S = tiled_t2r_S.get_slice(tidx)
        t2r_dP = tcgen05.make_tmem_copy(ld32, tdPtdP).get_slice(tidx)
        tStS_r = t2r_S.partition_S(tStS)
        tdPtdP_r = t2r_dP.partition_S(tdPtdP)
        tScS = t2r_S.partition_D(thr_S.partition_C(cute.make_identity_tensor((PAIR, BLOCK))))
        rS = cute.make_rmem_tensor(tScS[None, 0, None, None].shape, Float32)
        rdP = cute.make_rmem_tensor(tScS[None, 0, None, None].shape, Float32)
        r2s = cute.make_tiled_copy_D(sm100_utils.get_smem_store_op(LayoutEnum.ROW_MAJOR, bf, Float32, tiled_t2r_S),
                                     tiled_t2r_S).get_slice(tidx)
        tRS_sP = r2s.partition_D(sP_epi)
        tRS_sdS = r2s.partition_D(sdS_epi)
        rP = cute.make_rmem_tensor(tScS[None, 0, None, None].shape, bf)
        rdS = cute.make_rmem_tensor(tScS[None, 0, None, None].shape, bf)

        t2r_dQ = tcgen05.make_tmem_copy(ld32, tdQtdQ).get_slice(tidx)
        tdQtdQ_r = t2r_dQ.partition_S(tdQtdQ)
        tdQcdQ = t2r_dQ.partition_D(thr_dQ.partition_C(cute.make_identity_tensor((PAIR, HEAD_DIM))))
        rdQ = cute.make_rmem_tensor(tdQcdQ[None, 0, None, None].shape, Float32)

        t2r_dV = tcgen05.make_tmem_copy(ld32, tdVtdV).get_slice(tidx)
        t2r_dK = tcgen05.make_tmem_copy(ld32, tdKtdK).get_slice(tidx)
        tdVtdV_r = t2r_dV.partition_S(tdVtdV)
        tdKtdK_r = t2r_dK.partition_S(tdKtdK)
        tdVcdV = t2r_dV.partition_D(thr_dV.partition_C(cute.make_identity_tensor((HEAD_DIM, BLOCK))))
        rdV = cute.make_rmem_tensor(tdVcdV[None, 0, None, None].shape, Float32)
        rdK = cute.make_rmem_tensor(tdVcdV[None, 0, None, None].shape, Float32)

        # ---- K, V tiles (two boxes each); K's padded rows zeroed before any MMA reads it
        kv_row_block = bh * nb + kv
        if warp_idx == 0:
            with cute.arch.elect_one():
                cute.arch.mbarrier_arrive_and_expect_tx(mbar_kv, 2 * 2 * BLOCK * HEAD_DIM)
            for s in cutlass.range_constexpr(2):
                cute.copy(tma_atom_K, tKgK[None, kv_row_block, s], tKsK[None, s], tma_bar_ptr=mbar_kv)
                cute.copy(tma_atom_V, tVgV[None, kv_row_block, s], tVsV[None, s], tma_bar_ptr=mbar_kv)
        cute.arch.mbarrier_wait(mbar_kv, 0)
        if size < BLOCK:
            # 64 rows x 128 columns, thread t zeroes column t of each padded row (two slabs)
            col = tidx % 64
            slab = tidx // 64
            for r in cutlass.range(size, BLOCK, unroll=1):
                sK_box[r, col, slab] = bf(0.0)
            cute.arch.fence_view_async_shared()
        cute.arch.barrier()

        scale_log2 = sm_scale * Float32(LOG2E)
        phase_tma = Int32(0)
        phase_mma = Int32(0)
        num_pairs = (count + 1) // 2
        row_in_pair = tScS[0][0]  # this thread's accumulator row (= tidx for the 32x32b loads)
        half = row_in_pair // BLOCK
        for it in cutlass.range(num_pairs, unroll=1):
            e0 = it * 2
            q0 = mIdx[item, e0]
            has1 = e0 + 1 < count
            q1 = q0
            if has1:
                q1 = mIdx[item, e0 + 1]
            # -- Q and dO of the pair: 4 boxes each
            if warp_idx == 0:
                with cute.arch.elect_one():
                    cute.arch.mbarrier_arrive_and_expect_tx(mbar_tma, 2 * 2 * PAIR * HEAD_DIM)
                for h in cutlass.range_constexpr(2):
                    qrb = bh * nb + (q0 if const_expr(h == 0) else q1)
                    for s in cutlass.range_constexpr(2):
                        cute.copy(tma_atom_Q, tQgQ[None, qrb, s], tQsQ[None, h + 2 * s], tma_bar_ptr=mbar_tma)
                        cute.copy(tma_atom_dO, tOgO[None, qrb, s], tOsO[None, h + 2 * s], tma_bar_ptr=mbar_tma)
            # -- this thread's q row: lse2 and delta
            my_q = q0
            if half == 1:
                my_q = q1
            grow = (bh * nb + my_q) * BLOCK + (row_in_pair % BLOCK)
            lse2 = mLSE2[grow]
            delta = mDelta[grow]
            if half == 1 and not has1:
                lse2 = Float32.inf
                delta = Float32(0.0)
            cute.arch.mbarrier_wait(mbar_tma, phase_tma)
            phase_tma = phase_tma ^ 1

            # -- S = Q K^T, dP = dO V^T
            if warp_idx == 0:
                fence_after()
                _gemm(mma_S, tStS, tSrQ, tSrK, False)
                _gemm(mma_dP, tdPtdP, tdPrdO, tdPrV, False)
                with cute.arch.elect_one():
                    tcgen05.commit(mbar_mma)
            cute.arch.mbarrier_wait(mbar_mma, phase_mma)
            phase_mma = phase_mma ^ 1
            fence_after()

            # -- P, dS (row per thread), to shared memory as bf16
            for n in cutlass.range_constexpr(cute.size(tScS, mode=[1])):
                cute.copy(t2r_S, tStS_r[None, n, None, None], rS)
                cute.copy(t2r_dP, tdPtdP_r[None, n, None, None], rdP)
                cute.arch.fence_view_async_tmem_load()
                tScS_n = tScS[None, n, None, None]
                for i in cutlass.range_constexpr(cute.size(rS)):
                    r, c = tScS_n[i]
                    p = cute.math.exp2(rS[i] * scale_log2 - lse2, fastmath=True)
                    ds = p * (rdP[i] - delta)
                    if c >= size:
                        p = Float32(0.0)
                        ds = Float32(0.0)
                    rP[i] = bf(p)
                    rdS[i] = bf(ds)
                cute.autovec_copy(rP, tRS_sP[None, n, None, None])
                cute.autovec_copy(rdS, tRS_sdS[None, n, None, None])
            cute.arch.fence_view_async_shared()
            fence_before()
            cute.arch.barrier()

            # -- dV^T += dO^T P, dK^T += Q^T dS, dQ = dS K
            if warp_idx == 0:
                fence_after()
                _gemm(mma_dV, tdVtdV, tdVrdOt, tdVrP, it > 0)
                _gemm(mma_dK, tdKtdK, tdKrQt, tdKrdS, it > 0)
                _gemm(mma_dQ, tdQtdQ, tdQrdS, tdQrKt, False)
                with cute.arch.elect_one():
                    tcgen05.commit(mbar_mma)
            cute.arch.mbarrier_wait(mbar_mma, phase_mma)
            phase_mma = phase_mma ^ 1
            fence_after()

            # -- dQ drain: TMEM -> registers -> shared -> cp.reduce.async.bulk (fp32 add)
            if tidx == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)  # the previous pair's drain
            cute.arch.barrier()
            for n in cutlass.range_constexpr(cute.size(tdQcdQ, mode=[1])):
                cute.copy(t2r_dQ, tdQtdQ_r[None, n, None, None], rdQ)
                cute.arch.fence_view_async_tmem_load()
                tdQcdQ_n = tdQcdQ[None, n, None, None]
                for i in cutlass.range_constexpr(cute.size(rdQ)):
                    r, c = tdQcdQ_n[i]
                    sdQ[r, c] = rdQ[i]
            cute.arch.fence_view_async_shared()
            fence_before()
            cute.arch.barrier()
            if tidx == 0:
                half_bytes = BLOCK * HEAD_DIM * 4
                g0 = cute.domain_offset(((bh * nb + q0) * BLOCK, 0), mdQaccum)
                _bulk_reduce_add_f32(sdQ.iterator, g0.iterator, half_bytes)
                if has1:
                    g1 = cute.domain_offset(((bh * nb + q1) * BLOCK, 0), mdQaccum)
                    _bulk_reduce_add_f32(sdQ.iterator + BLOCK * HEAD_DIM, g1.iterator, half_bytes)
                cute.arch.cp_async_bulk_commit_group()

        # ---- epilogue: dV^T, dK^T (thread t = head-dim column t) -> dv, dk rows of the kv block
        row0 = kv_row_block * BLOCK
        for n in cutlass.range_constexpr(cute.size(tdVcdV, mode=[1])):
            cute.copy(t2r_dV, tdVtdV_r[None, n, None, None], rdV)
            cute.copy(t2r_dK, tdKtdK_r[None, n, None, None], rdK)
            cute.arch.fence_view_async_tmem_load()
            tdVcdV_n = tdVcdV[None, n, None, None]
            for i in cutlass.range_constexpr(cute.size(rdV)):
                d, j = tdVcdV_n[i]
                dv = rdV[i]
                dk = rdK[i] * sm_scale
                if j >= size:
                    dv = Float32(0.0)
                    dk = Float32(0.0)
                mdV[row0 + j, d] = bf(dv)
                mdK[row0 + j, d] = bf(dk)
        if tidx == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=False)
        fence_before()
        cute.arch.barrier()
        fence_after()
        tmem.relinquish_alloc_permit()
        tmem.free(tmem_ptr)

    # ------------------------------------------------------------------ compilation
    def fake_args(self) -> tuple:
        return main_fake_args(self.dtype, io_align=16, tma_align=16)
