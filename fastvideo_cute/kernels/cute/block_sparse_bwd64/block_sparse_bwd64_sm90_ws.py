# SPDX-License-Identifier: Apache-2.0
"""VSA block-sparse attention backward, 64-token blocks: the warp-specialized Hopper main kernel
(wgmma + TMA, sm_90a).

The same stage, contract and spec as ``block_sparse_bwd64_sm90`` (kv work items ``(b*H + h) * nb +
kv``, each item's k2q list walked one 64-row q block per step), with the step's work split over
three warpgroups that run concurrently (384 threads, one CTA per SM, ``setmaxnreg`` 24 / 224 / 256):

    WG0  warp 0  producer: K, V once; per step Q + lse2 (Q ring) and dO + delta (dO ring) by TMA /
                 256-byte bulk copies, ``q_stages`` deep
         warp 1  dQ store: each step's 64 x 128 fp32 dQ tile, staged in shared memory by WG2
                 (128-byte swizzle), added into dq_accum by one TMA tensor reduce-add
                 (``cp.reduce.async.bulk.tensor``, four 64 x 32 boxes); with ``flat_dq`` staged in
                 the accumulator's register order and added by one 32 KB ``cp.reduce.async.bulk``
                 into a dq_accum tile of that order (the postprocess un-permutes it)
    WG1          S^T = K Q^T (RS: K in registers with ``kv_regs``, else SS), P^T = exp2(S^T *
                 scale_log2 - lse2) with padded keys 0 (select), P^T (fp32) handed to WG2 through
                 shared memory (thread-private order), dV += P^T dO (RS)
    WG2          dP^T = V dO^T (RS with V in registers / SS), dS^T = P^T * (dP^T - delta) with padded
                 keys 0 (select), dS written transposed by stmatrix, dQ = dS K (SS), dK += dS^T Q (RS),
                 dQ staged for the store warp while dK runs

Hand-offs (named barriers; each is arrived by one side and waited by the other, equal counts):
``P_READY`` WG1 -> WG2 (P^T of the step is in ``sP``), ``P_FREE`` WG2 -> WG1 (``sP`` read; not
signalled for the last ``p_stages`` steps), ``DQ_FULL`` WG2 -> store warp, ``DQ_FREE`` store warp ->
WG2 (the reduce of the tile that used the buffer has read it). The Q and dO ring slots are released
by both consumer warpgroups (8 warp arrivals per slot).

Work: one CTA per (item, q group) of the ``gb`` bounds (``BlockSparseBwd64Sm90Ws.__call__``); with
``grouped`` the CTAs of one kv block add their dK/dV into fp32 accumulators, else each writes its kv
block's bf16 rows once.

Numerics are the single-warpgroup kernel's, operation for operation (the same MMAs on the same
operands, the same selects; P^T crosses warpgroups in fp32), so its GPU tests hold this kernel too:
K's padded rows are zeroed in shared memory once by WG2 (dQ = dS K would give 0 * NaN; the S^T and
dP^T rows of padded keys are discarded by the selects whatever they read), dk/dv rows of padded
keys are exactly 0, dq is reduce-added in no fixed order (dk, dv bitwise run to run without q
groups; with them their fp32 sums have no fixed order either). Shapes and launch limits:
``limits.py``; tensors as in ``block_sparse_bwd64_sm100`` (2-D row views). Measured against cuDNN
BSA's blk64 backward: ``docs/hopper-64-token.md``.
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
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warp, warpgroup
from quack import copy_utils as quack_copy
from quack import layout_utils

from fastvideo_cute.jit import CuteKernel, fake_matrix, fake_vector

from ..common.bulk import L2_EVICT_FIRST, bulk_copy_g2s, bulk_copy_s2g, bulk_reduce_add_f32
from ..common.tma import tma_row_tiles
from ..common.wgmma import wgmma_gemm
from .block_sparse_bwd64_common import main_fake_args
from .last_arrival import add_rows_last_arrival, group_parts
from .pointwise import dscores_t, probs_t
from .limits import BLOCK, HEAD_DIM, TICKET_COUNTERS, TICKET_WS_FLOATS

__all__ = ["BlockSparseBwd64Sm90Ws", "THREADS", "smem_bytes"]

THREADS = 384
WG = 128  # threads per warpgroup
LOG2E = math.log2(math.e)
# registers per thread after setmaxnreg (producer warpgroup, WG1, WG2): 24 + 224 + 256 = 504 per
# thread triple fits the 64 K register file with one CTA per SM; WG2 holds the most (dK, dQ, dP^T
# accumulators, P^T, V)
REGS_PRODUCER = 24
REGS_WG1 = 224
REGS_WG2 = 256
# named barrier ids (0 is the CTA-wide barrier); P_READY/P_FREE/DQ_FULL/DQ_FREE + stage
P_READY, P_FREE, DQ_FULL, DQ_FREE, WG2_SYNC = 1, 3, 5, 7, 9
# bulk_dkv's epilogue: both MMA warpgroups out of their loops (then the Q and dO rings are free),
# WG1's staging done (WG2's uses WG2_SYNC)
EPI_SYNC, EPI_WG1 = 10, 11
MAX_STAGES = 2  # of the P and dQ buffers (two barrier ids each)
PIECE_ROWS = 16  # tma_dkv: one warp's rows of an m64 accumulator tile
SMEM_LIMIT = 227 * 1024  # per CTA on sm_90


def smem_bytes(q_stages: int = 3, p_stages: int = 1, dq_stages: int = 1) -> int:
    """K, V, the Q and dO rings, P^T (64 x 64 fp32 per stage), dS (64 x 64 bf16), the dQ staging
    tiles, the stats, barriers, alignment."""
    tile = BLOCK * HEAD_DIM * 2
    return (tile * (2 + 2 * q_stages) + BLOCK * BLOCK * (4 * p_stages + 2) + BLOCK * HEAD_DIM * 4 * dq_stages
            + 2 * BLOCK * 4 * q_stages + 8 * (1 + 4 * q_stages) + 6 * 1024)


class BlockSparseBwd64Sm90Ws(CuteKernel):
    """Warp-specialized wgmma main kernel of the 64-token VSA backward (module docstring). Called
    (compiled) as ``fn(q2d, k2d, v2d, do2d, dk2d, dv2d, dqacc2d, lse2, delta, idx2d, num, vbs, order, gb,
    ws, tk, sm_scale)``: ``BlockSparseBwd64Sm90``'s arguments, ``gb`` (int32 ``[items, groups + 1]``: item
    ``i``'s q group ``g`` is its k2q list's entries ``gb[i, g] .. gb[i, g + 1] - 1``). One CTA per
    (item, group): with one group through the work order ``order``; with more, CTA ``w`` takes
    ``(b*H + h, g, kv)`` in that order from ``w`` (``order`` unused), so the CTAs resident together
    read Q/dO and reduce dQ within one head's q group (L2), and dk/dv must be ``grouped``
    accumulators or the build ``ticket_dkv`` (``ws``: fp32, ``items * 2 * 64 * 128`` elements; ``tk``: int32
    ``items * limits.TICKET_COUNTERS``, zero; both unused by other builds, which take any small tensors there)."""

    name = "block_sparse_bwd64_sm90_ws"

    def __init__(self, q_stages: int = 3, p_stages: int = 1, dq_stages: int = 1, kv_regs: bool = True,
                 grouped: bool = False, bulk_dkv: bool = True, narrow_dq: bool = False, flat_dq: bool = False,
                 zero_pad_v: bool = False, ticket_dkv: bool = False, pair_stores: bool = False,
                 tma_dkv: bool = False, ds_out: bool = False, ds_evict_first: bool = False):
        """``q_stages``: depth of the Q and dO rings; ``p_stages`` / ``dq_stages``: buffers of the
        P^T hand-off and of the dQ staging tile (1 or 2: with 2 the producing side runs a step
        ahead); ``kv_regs``: WG1 holds K and WG2 holds V in registers (S^T and dP^T as RS wgmma,
        loaded once by ldmatrix), halving those MMAs' shared-memory reads; ``grouped``: dk/dv are fp32 accumulators that
        each CTA adds its kv block's dK (times sm_scale) / dV into (the caller splits a kv block's k2q
        list over several CTAs by q group, ``mGB``, and converts), instead of bf16 rows written once;
        ``bulk_dkv`` (with ``grouped``; no effect without): each warpgroup stages its 64 x 128 tile
        (times the scale, rows of padded keys 0) row-major in fp32 in a ring it no longer reads (WG1:
        the dO ring, after both MMA warpgroups left their loops; WG2: the Q ring) and adds it into
        the accumulator's 32 KB of rows by one bulk reduce-add (``cp.reduce.async.bulk``), instead of
        64 fp32 reductions per thread (the default: exact on the H200 and 2.9 % faster at 65,536
        tokens than the reductions, ``benchmarks/results/bwd64_sm90_h200_v10.json``);
        ``narrow_dq``: dQ = dS K of a partial kv tile issues only the k-steps (16 keys each) up to
        ceil16(size): dS's columns of padded keys are 0 by select and K's padded rows 0, so the
        skipped steps would add exact zeros (a video grid's edge tiles hold 8-32 keys);
        ``flat_dq``: WG2 stages each dQ tile in its accumulator's register order (thread ``t``'s
        registers ``4 i .. 4 i + 3`` at floats ``512 i + 4 t``: 16 conflict-free 128-bit stores a thread)
        and the store warp adds it by one 32 KB bulk reduce-add into dq_accum's tile of the same order
        (``dq_accum`` rows ``64 rb .. 64 rb + 63`` hold q block ``rb``'s tile in that order: the caller runs
        ``BlockSparseBwd64PostprocessFrag``), instead of the 128-byte swizzled tile, whose 64-bit stores
        from the m64n128 fragment take two-way bank conflicts (half the staging's shared-memory
        wavefronts are replays: Nsight Compute, 2026-12-03); ``zero_pad_v``: WG2 zeroes V's padded rows in
        shared memory with K's (before loading V into registers), so dP^T's rows of padded keys are exact
        zeros and dS^T = P^T (dP^T - delta) needs no padded-key select (P^T's are 0 by WG1's select): 32
        FSEL a step fewer in WG2's loop; ``ticket_dkv`` (not with ``grouped``): dk/dv are the bf16 outputs
        even when a kv block's list is split over q groups: the group that finishes last sums the parts
        (``last_arrival``: the others hand theirs over through the fp32 workspace ``mWs``, counters ``mTk``
        zeroed by the caller) and writes the rows once, so the chain needs no zeroed fp32 accumulators
        and no conversion pass; ``pair_stores``: the bf16 dk/dv rows (padded keys' 0 included) written
        as the fragment's pairs of adjacent columns, 32 four-byte stores a thread instead of 64
        two-byte ones; ``tma_dkv`` (not with ``grouped``): each warp writes its 16 bf16 rows by stmatrix
        into a swizzled tile (dK: K's, free once WG2 left its loop; dV: a 16 KB buffer of its own, so
        WG1 waits on no one) and two TMA tensor stores of 16 x 64 pieces; ``ds_out`` (the split
        backward of ``adapters/cute_sm90_bwd64_split``; needs ``flat_dq``, and ``ticket_dkv`` with q groups): no dQ GEMM
        and no reduction into ``dq_accum`` (given, unused): the store warp bulk-stores each step's bf16 dS
        tile (8 KB, the swizzled image WG2 writes by stmatrix) into the workspace at ``mWs`` (its base
        pointer; 8 KB tiles) at the slot ``mTk[item * width + t]`` (int32, the caller's q-owned order), and
        ``BlockSparseDq64Sm90`` sums dQ from them; with q groups both buffers hold the ticket's part first
        (``ds_store``); ``ds_evict_first`` (with ``ds_out``): those stores carry the L2 policy evict_first
        (the tiles are read back by the next launch, long after the L2 has cycled: they should not push out
        the Q / dO tiles the resident CTAs share; a cache hint only, the same bits)."""
        for name, v in (("p_stages", p_stages), ("dq_stages", dq_stages)):
            if v not in (1, MAX_STAGES):
                raise ValueError(f"{name} must be 1 or {MAX_STAGES}, got {v}")
        if q_stages not in (2, 3, 4):
            raise ValueError(f"q_stages must be 2, 3 or 4, got {q_stages}")
        need = smem_bytes(q_stages, p_stages, dq_stages) + (BLOCK * HEAD_DIM * 2 + 1024 if tma_dkv else 0)
        if need > SMEM_LIMIT:
            raise ValueError(f"q_stages={q_stages}, p_stages={p_stages}, dq_stages={dq_stages}, tma_dkv={tma_dkv} need {need} B of "
                             f"shared memory, more than the {SMEM_LIMIT} B a CTA has on sm_90")
        self.dtype = cutlass.BFloat16
        self.q_stages, self.p_stages, self.dq_stages = int(q_stages), int(p_stages), int(dq_stages)
        self.kv_regs, self.grouped = bool(kv_regs), bool(grouped)
        self.bulk_dkv = bool(bulk_dkv) and self.grouped
        self.narrow_dq = bool(narrow_dq)
        self.flat_dq = bool(flat_dq)
        self.zero_pad_v = bool(zero_pad_v)
        self.ticket_dkv = bool(ticket_dkv)
        self.pair_stores = bool(pair_stores)
        self.tma_dkv = bool(tma_dkv)
        # the split backward: dS tiles bulk-stored (slots in mTk) instead of dQ computed and reduced
        self.ds_out = bool(ds_out)
        if self.ds_out and not (self.flat_dq and self.dq_stages == 1):
            raise ValueError("ds_out needs flat_dq and dq_stages=1")
        self.ds_evict_first = bool(ds_evict_first)
        if self.ds_evict_first and not self.ds_out:
            raise ValueError("ds_evict_first is a hint on ds_out's stores: it needs ds_out")
        if self.ds_out and self.grouped:
            raise ValueError("ds_out hands dk/dv over by ticket_dkv with q groups: it cannot be combined with grouped")
        if self.tma_dkv and self.grouped:
            raise ValueError("tma_dkv stores bf16 dk/dv rows: it cannot be combined with grouped")
        if self.ticket_dkv and self.grouped:
            raise ValueError("ticket_dkv writes bf16 dk/dv itself: it cannot be combined with grouped")

    def config(self):
        return {"q_stages": self.q_stages, "p_stages": self.p_stages, "dq_stages": self.dq_stages,
                "kv_regs": self.kv_regs, "grouped": self.grouped, "bulk_dkv": self.bulk_dkv,
                "narrow_dq": self.narrow_dq, "flat_dq": self.flat_dq, "zero_pad_v": self.zero_pad_v,
                "ticket_dkv": self.ticket_dkv, "pair_stores": self.pair_stores,
                "tma_dkv": self.tma_dkv, **({"ds_out": True} if self.ds_out else {}),
                **({"ds_evict_first": True} if self.ds_evict_first else {})}

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mdO: cute.Tensor, mdK: cute.Tensor,
                 mdV: cute.Tensor, mdQaccum: cute.Tensor, mLSE2: cute.Tensor, mDelta: cute.Tensor,
                 mIdx: cute.Tensor, mNum: cute.Tensor, mVbs: cute.Tensor, mOrder: cute.Tensor, mGB: cute.Tensor,
                 mWs: cute.Tensor, mTk: cute.Tensor, sm_scale: Float32, stream: cuda.CUstream):
        bf = self.dtype
        k_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, bf)
        tile_layout = cute.tile_to_shape(k_atom, (BLOCK, HEAD_DIM), order=(0, 1))
        ring_layout = cute.tile_to_shape(k_atom, (BLOCK, HEAD_DIM, self.q_stages), order=(0, 1, 2))
        ds_layout = cute.tile_to_shape(k_atom, (BLOCK, BLOCK), order=(0, 1))  # dS [q, kv], kv contiguous
        f_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, Float32)
        dq_tile = cute.tile_to_shape(f_atom, (BLOCK, HEAD_DIM), order=(0, 1))  # dQ staging, 128-byte swizzle
        dq_ring = cute.tile_to_shape(f_atom, (BLOCK, HEAD_DIM, self.dq_stages), order=(0, 1, 2))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(g2s, mQ, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_dO, tma_dO = cpasync.make_tiled_tma_atom(g2s, mdO, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, tile_layout, (BLOCK, HEAD_DIM))
        tma_atom_dQ, tma_dQ = cpasync.make_tiled_tma_atom(cpasync.CopyReduceBulkTensorTileS2GOp(), mdQaccum, dq_tile,
                                                          (BLOCK, HEAD_DIM))

        if const_expr(self.tma_dkv):  # 16-row x 64-column pieces of the dK / dV rows
            piece = cute.tile_to_shape(k_atom, (PIECE_ROWS, HEAD_DIM // 2), order=(0, 1))
            s2g = cpasync.CopyBulkTensorTileS2GOp()
            tma_atom_dK, tma_dK = cpasync.make_tiled_tma_atom(s2g, mdK, piece, (PIECE_ROWS, HEAD_DIM // 2))
            tma_atom_dV, tma_dV = cpasync.make_tiled_tma_atom(s2g, mdV, piece, (PIECE_ROWS, HEAD_DIM // 2))
        else:  # never used
            tma_atom_dK, tma_dK, tma_atom_dV, tma_dV = tma_atom_K, tma_K, tma_atom_V, tma_V

        K_MAJ, MN_MAJ = OperandMajorMode.K, OperandMajorMode.MN
        a_src = warpgroup.OperandSource.RMEM if const_expr(self.kv_regs) else warpgroup.OperandSource.SMEM
        mma_s = sm90_helpers.make_trivial_tiled_mma(bf, bf, K_MAJ, K_MAJ, Float32, (1, 1, 1), tiler_mn=(BLOCK, BLOCK),
                                                    a_source=a_src)
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
            sV: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(tile_layout)], 1024]
            sQ: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ring_layout)], 1024]
            sdO: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ring_layout)], 1024]
            sdS: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(ds_layout)], 1024]
            sP: cute.struct.Align[cute.struct.MemRange[Float32, BLOCK * BLOCK * self.p_stages], 128]  # thread-private order
            sdQ: cute.struct.Align[cute.struct.MemRange[Float32, cute.cosize(dq_ring)], 1024]
            sLse: cute.struct.Align[cute.struct.MemRange[Float32, BLOCK * self.q_stages], 128]
            sDelta: cute.struct.Align[cute.struct.MemRange[Float32, BLOCK * self.q_stages], 128]
            sDV: cute.struct.Align[cute.struct.MemRange[bf, cute.cosize(tile_layout) if self.tma_dkv else 8], 1024]

        scale_log2 = sm_scale * Float32(LOG2E)
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_dO, tma_dO, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_dQ,
            mdQaccum if const_expr(self.flat_dq) else tma_dQ,
            mdK, mdV, tma_atom_dK, tma_dK, tma_atom_dV, tma_dV, mLSE2, mDelta, mIdx, mNum, mVbs, mOrder, mGB,
            mWs, mTk, sm_scale, scale_log2,
            mma_s, mma_kv, mma_dq, tile_layout, ring_layout, ds_layout, dq_ring, SharedStorage,
        ).launch(grid=(cute.size(mGB.shape[0]) * (cute.size(mGB.shape[1]) - 1), 1, 1), block=(THREADS, 1, 1),
                 smem=SharedStorage.size_in_bytes(),
                 stream=stream, min_blocks_per_mp=1)

    # ------------------------------------------------------------------ device side
    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor, tma_atom_dO: cute.CopyAtom, mdO: cute.Tensor,
               tma_atom_K: cute.CopyAtom, mK: cute.Tensor, tma_atom_V: cute.CopyAtom, mV: cute.Tensor,
               tma_atom_dQ: cute.CopyAtom, mdQaccum: cute.Tensor,
               mdK: cute.Tensor, mdV: cute.Tensor, tma_atom_dK: cute.CopyAtom, tma_dK: cute.Tensor,
               tma_atom_dV: cute.CopyAtom, tma_dV: cute.Tensor, mLSE2: cute.Tensor, mDelta: cute.Tensor,
               mIdx: cute.Tensor, mNum: cute.Tensor, mVbs: cute.Tensor, mOrder: cute.Tensor, mGB: cute.Tensor,
               mWs: cute.Tensor, mTk: cute.Tensor, sm_scale: Float32, scale_log2: Float32,
               mma_s: cute.TiledMma, mma_kv: cute.TiledMma, mma_dq: cute.TiledMma,
               tile_layout: cute.ComposedLayout, ring_layout: cute.ComposedLayout, ds_layout: cute.ComposedLayout,
               dq_ring: cute.ComposedLayout, SharedStorage: cutlass.Constexpr):
        tidx, _, _ = cute.arch.thread_idx()
        work, _, _ = cute.arch.block_idx()
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        nb = cute.size(mVbs.shape[0])
        groups = cute.size(mGB.shape[1]) - 1
        item = Int32(0)
        g = Int32(0)
        if groups == 1:  # CTA -> item through the work order
            item = mOrder[work]
        else:  # CTA -> (b*H + h, q group, kv): the CTAs running together share a head and a q group
            per_head = groups * nb
            bh0 = work // per_head
            rem = work - bh0 * per_head
            g = rem // nb
            item = bh0 * nb + (rem - g * nb)
        item = cute.arch.make_warp_uniform(item)
        bh = item // nb
        kv = item - bh * nb
        num = cutlass.min(cutlass.max(mNum[item], Int32(0)), mIdx.shape[1])
        base = cutlass.min(cutlass.max(mGB[item, g], Int32(0)), num)  # the group's part of the k2q list
        count = cutlass.min(cutlass.max(mGB[item, g + 1], base), num) - base
        size = cutlass.min(cutlass.max(mVbs[kv], Int32(0)), Int32(BLOCK))

        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_dO, tma_atom_K, tma_atom_V):
                cpasync.prefetch_descriptor(atom)
            if const_expr(not self.flat_dq):
                cpasync.prefetch_descriptor(tma_atom_dQ)
        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        tile_bytes = cute.size_in_bytes(self.dtype, tile_layout)
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        consumers = pipeline.CooperativeGroup(pipeline.Agent.Thread, 2 * WG // 32)  # one arrival per MMA warp
        bar_kv = pipeline.MbarrierArray(storage.bar_kv.data_ptr(), num_stages=1, agent=(pipeline.PipelineOp.TmaLoad, one))
        pipe_q = pipeline.PipelineTmaAsync.create(barrier_storage=storage.bar_q.data_ptr(), num_stages=self.q_stages,
                                                  producer_group=one, consumer_group=consumers,
                                                  tx_count=tile_bytes + BLOCK * 4, defer_sync=True)
        pipe_do = pipeline.PipelineTmaAsync.create(barrier_storage=storage.bar_do.data_ptr(), num_stages=self.q_stages,
                                                   producer_group=one, consumer_group=consumers,
                                                   tx_count=tile_bytes + BLOCK * 4, defer_sync=True)
        cute.arch.mbarrier_init_fence()
        cute.arch.barrier()
        if count > 0:
            wg = warp_idx // 4
            if wg == 0:
                cute.arch.setmaxregister_decrease(REGS_PRODUCER)
                if warp_idx == 0:
                    self.producer(tma_atom_Q, mQ, tma_atom_dO, mdO, tma_atom_K, mK, tma_atom_V, mV, mLSE2, mDelta,
                                  mIdx, tile_layout, ring_layout, storage, bar_kv, pipe_q, pipe_do, item, bh, kv, nb,
                                  base, count, tile_bytes)
                if warp_idx == 1:
                    if const_expr(self.ds_out):
                        self.ds_store(mWs, mIdx, mTk, mGB, storage, item, base, count)
                    elif const_expr(self.flat_dq):
                        self.dq_store_flat(mdQaccum, mIdx, storage, item, bh, nb, base, count)
                    else:
                        self.dq_store(tma_atom_dQ, mdQaccum, mIdx, dq_ring, storage, item, bh, nb, base, count)
            if wg == 1:
                cute.arch.setmaxregister_increase(REGS_WG1)
                self.wg_s_dv(mdV, mma_s, mma_kv, tile_layout, ring_layout, storage, bar_kv, pipe_q, pipe_do,
                             scale_log2, tidx - WG, kv, bh, nb, count, size, (mWs, mTk, mGB, item, num),
                             (tma_atom_dV, tma_dV, storage.sDV))
            if wg == 2:
                cute.arch.setmaxregister_increase(REGS_WG2)
                self.wg_dp_dq_dk(mdK, mma_s, mma_kv, mma_dq, tile_layout, ring_layout, ds_layout, dq_ring, storage, bar_kv,
                                 pipe_q, pipe_do, sm_scale, tidx - 2 * WG, kv, bh, nb, count, size,
                                 (mWs, mTk, mGB, item, num), (tma_atom_dK, tma_dK, storage.sK))

    # ---- WG0 warp 0: loads
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
        for t in cutlass.range(count, unroll=1):
            rb = bh * nb + mIdx[item, base + t]
            s = state.index
            pipe_q.producer_acquire(state)
            cute.copy(tma_atom_Q, tQgQ[None, rb], tQsQ[None, s], tma_bar_ptr=pipe_q.producer_get_barrier(state))
            with cute.arch.elect_one():
                bulk_copy_g2s(mLSE2.iterator + rb * BLOCK, lse_ptr + s * BLOCK, pipe_q.producer_get_barrier(state),
                              BLOCK * 4)
            pipe_do.producer_acquire(state)
            cute.copy(tma_atom_dO, tOgO[None, rb], tOsO[None, s], tma_bar_ptr=pipe_do.producer_get_barrier(state))
            with cute.arch.elect_one():
                bulk_copy_g2s(mDelta.iterator + rb * BLOCK, delta_ptr + s * BLOCK, pipe_do.producer_get_barrier(state),
                              BLOCK * 4)
            state.advance()

    # ---- WG0 warp 1: dQ tiles into dq_accum
    @cute.jit
    def dq_store(self, tma_atom_dQ, mdQaccum, mIdx, dq_ring, storage, item, bh, nb, base, count):
        sdQ = storage.sdQ.get_tensor(dq_ring.outer, swizzle=dq_ring.inner)
        tDsD, tDgD = tma_row_tiles(tma_atom_dQ, mdQaccum, sdQ, (BLOCK, HEAD_DIM))
        for t in cutlass.range(count, unroll=1):
            rb = bh * nb + mIdx[item, base + t]
            d = t % self.dq_stages
            # the reductions of step t - dq_stages (the same buffer) have read it
            cute.arch.cp_async_bulk_wait_group(self.dq_stages - 1, read=True)
            cute.arch.barrier_arrive(barrier_id=DQ_FREE + d, number_of_threads=WG + 32)
            cute.arch.barrier(barrier_id=DQ_FULL + d, number_of_threads=WG + 32)
            cute.copy(tma_atom_dQ, tDsD[None, d], tDgD[None, rb])
            cute.arch.cp_async_bulk_commit_group()
        cute.arch.cp_async_bulk_wait_group(0, read=True)  # the buffer stays until the TMA unit has read it

    @cute.jit
    def dq_store_flat(self, mdQaccum, mIdx, storage, item, bh, nb, base, count):
        """``flat_dq``'s store warp: lane 0 adds each staged tile (32 KB, register order) into q block
        ``rb``'s 32 KB of ``dq_accum`` by one bulk reduce-add; its bulk groups are lane 0's, so lane 0
        alone waits on them, and the whole warp meets the named barriers."""
        lane = cute.arch.lane_idx()
        tile = BLOCK * HEAD_DIM
        for t in cutlass.range(count, unroll=1):
            rb = bh * nb + mIdx[item, base + t]
            d = t % self.dq_stages
            if lane == 0:  # the reduction of step t - dq_stages (the same buffer) has read it
                cute.arch.cp_async_bulk_wait_group(self.dq_stages - 1, read=True)
            cute.arch.barrier_arrive(barrier_id=DQ_FREE + d, number_of_threads=WG + 32)
            cute.arch.barrier(barrier_id=DQ_FULL + d, number_of_threads=WG + 32)
            if lane == 0:
                bulk_reduce_add_f32(storage.sdQ.data_ptr() + d * tile, mdQaccum.iterator + rb * tile, tile * 4)
                cute.arch.cp_async_bulk_commit_group()
        if lane == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def ds_store(self, mWs, mIdx, mTk, mGB, storage, item, base, count):
        """``ds_out`` (the split backward): lane 0 bulk-stores each step's dS tile (8 KB, the swizzled image)
        into the dS workspace (8 KB tiles) at tile ``slots[item * width + base + t]`` (the pair's slot in
        q-owned order, written by the caller). One q group: the workspace is ``mWs`` itself and the slots
        ``mTk``. Several (``ticket_dkv``'s dk/dv hand-over needs both buffers): ``mWs`` holds the ticket
        workspace (``2 * items * 64 * 128`` fp32) and then the dS tiles, ``mTk`` the zeroed counters
        (``items * TICKET_COUNTERS`` int32) and then the slots."""
        lane = cute.arch.lane_idx()
        width = cute.size(mIdx.shape[1])
        items = cute.size(mGB.shape[0])
        several = cutlass.min(cute.size(mGB.shape[1]) - 2, Int32(1))  # 1 with q groups, else 0
        slot0 = several * items * TICKET_COUNTERS + item * width + base  # this CTA's first slot in mTk
        ds_base = mWs.iterator + cutlass.Int64(several) * cutlass.Int64(items) * TICKET_WS_FLOATS
        for t in cutlass.range(count, unroll=1):
            slot = mTk[slot0 + t]
            if lane == 0:
                cute.arch.cp_async_bulk_wait_group(0, read=True)
            cute.arch.barrier_arrive(barrier_id=DQ_FREE, number_of_threads=WG + 32)
            cute.arch.barrier(barrier_id=DQ_FULL, number_of_threads=WG + 32)
            if lane == 0:
                bulk_copy_s2g(storage.sdS.data_ptr(), ds_base + cutlass.Int64(slot) * (BLOCK * BLOCK // 2), BLOCK * BLOCK * 2,
                              cache_hint=L2_EVICT_FIRST if self.ds_evict_first else 0)
                cute.arch.cp_async_bulk_commit_group()
        if lane == 0:
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    # ---- WG1: S, P, dV
    @cute.jit
    def wg_s_dv(self, mdV, mma_s, mma_kv, tile_layout, ring_layout, storage, bar_kv, pipe_q, pipe_do, scale_log2,
                wtid, kv, bh, nb, count, size, ticket_args, tma_args):
        bf = self.dtype
        sK = storage.sK.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sQ = storage.sQ.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdO = storage.sdO.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdOt = layout_utils.transpose_view(sdO)
        sLse = storage.sLse.get_tensor(cute.make_layout((BLOCK, self.q_stages)))
        thr_s = mma_s.get_slice(wtid)
        thr_kv = mma_kv.get_slice(wtid)
        tSrK = thr_s.make_fragment_A(thr_s.partition_A(sK))  # registers with kv_regs (loaded below)
        tSrQ = thr_s.make_fragment_B(thr_s.partition_B(sQ))
        tVrdOt = thr_kv.make_fragment_B(thr_kv.partition_B(sdOt))
        acc_S = cute.make_rmem_tensor(thr_s.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_dV = cute.make_rmem_tensor(thr_kv.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        acc_dV.fill(0.0)
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        tScS_mn = layout_utils.reshape_acc_to_mn(thr_s.partition_C(cute.make_identity_tensor((BLOCK, BLOCK))))
        tP_view = layout_utils.reshape_acc_to_frgA(acc_S)
        rP = cute.make_rmem_tensor_like(tP_view, bf)
        num_cols = cute.size(acc_S_mn, mode=[1])
        lse2 = cute.make_rmem_tensor((num_cols,), Float32)

        bar_kv.wait(0, 0)
        if const_expr(self.kv_regs):
            self.load_a_regs(mma_s, sK, tSrK, wtid)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        for t in cutlass.range(count, unroll=1):
            s = state.index
            pipe_q.consumer_wait(state)
            wgmma_gemm(mma_s, acc_S, tSrK, tSrQ[None, None, None, s], True)
            for c in cutlass.range_constexpr(num_cols):
                lse2[c] = sLse[tScS_mn[0, c][1], s]
            warpgroup.wait_group(0)
            pipe_q.consumer_release(state)
            probs_t(acc_S_mn, tScS_mn, lse2, scale_log2, size)
            rP.store(tP_view.load().to(bf))
            ps = t % self.p_stages
            if t >= self.p_stages:  # WG2 has read step t - p_stages' P^T from this buffer
                cute.arch.barrier(barrier_id=P_FREE + ps, number_of_threads=2 * WG)
            cute.autovec_copy(acc_S, self.p_slot(storage, wtid, acc_S, ps))
            cute.arch.barrier_arrive(barrier_id=P_READY + ps, number_of_threads=2 * WG)
            pipe_do.consumer_wait(state)
            wgmma_gemm(mma_kv, acc_dV, rP, tVrdOt[None, None, None, s], False)
            warpgroup.wait_group(0)
            pipe_do.consumer_release(state)
            state.advance()
        if const_expr(self.bulk_dkv):  # into the dO ring, once WG2 (the ring's other reader) is done
            cute.arch.barrier(barrier_id=EPI_SYNC, number_of_threads=2 * WG)
            self.bulk_add_rows(acc_dV, thr_kv, storage.sdO.data_ptr(), mdV, (bh * nb + kv) * BLOCK, size,
                               Float32(1.0), wtid, EPI_WG1)
        elif const_expr(self.ticket_dkv):
            self.store_rows_ticket(acc_dV, thr_kv, mdV, (bh * nb + kv) * BLOCK, size, Float32(1.0), 1, wtid, ticket_args,
                                   (mma_kv, tile_layout, bh * nb + kv, *tma_args))
        else:
            self.store_rows(acc_dV, thr_kv, mdV, (bh * nb + kv) * BLOCK, size, Float32(1.0),
                            (mma_kv, tile_layout, bh * nb + kv, *tma_args), wtid)

    # ---- WG2: dP, dS, dQ, dK
    @cute.jit
    def wg_dp_dq_dk(self, mdK, mma_s, mma_kv, mma_dq, tile_layout, ring_layout, ds_layout, dq_ring, storage, bar_kv, pipe_q,
                    pipe_do, sm_scale, wtid, kv, bh, nb, count, size, ticket_args, tma_args):
        bf = self.dtype
        sK = storage.sK.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sV = storage.sV.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        sQ = storage.sQ.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdO = storage.sdO.get_tensor(ring_layout.outer, swizzle=ring_layout.inner)
        sdS = storage.sdS.get_tensor(ds_layout.outer, swizzle=ds_layout.inner)
        sQt = layout_utils.transpose_view(sQ)
        sKt = layout_utils.transpose_view(sK)
        sdSt = layout_utils.transpose_view(sdS)
        sDelta = storage.sDelta.get_tensor(cute.make_layout((BLOCK, self.q_stages)))
        sdQ = storage.sdQ.get_tensor(dq_ring.outer, swizzle=dq_ring.inner)
        thr_s = mma_s.get_slice(wtid)
        thr_kv = mma_kv.get_slice(wtid)
        thr_dq = mma_dq.get_slice(wtid)
        tPrV = thr_s.make_fragment_A(thr_s.partition_A(sV))  # registers with kv_regs (loaded below)
        tPrdO = thr_s.make_fragment_B(thr_s.partition_B(sdO))
        tKrQt = thr_kv.make_fragment_B(thr_kv.partition_B(sQt))
        tQrdS = thr_dq.make_fragment_A(thr_dq.partition_A(sdS))
        tQrKt = thr_dq.make_fragment_B(thr_dq.partition_B(sKt))
        acc_dP = cute.make_rmem_tensor(thr_s.partition_shape_C((BLOCK, BLOCK)), Float32)
        acc_dK = cute.make_rmem_tensor(thr_kv.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        acc_dK.fill(0.0)
        rP = cute.make_rmem_tensor_like(acc_dP, Float32)  # P^T from WG1, in acc_dP's order
        acc_dP_mn = layout_utils.reshape_acc_to_mn(acc_dP)
        rP_mn = layout_utils.reshape_acc_to_mn(rP)
        tScS_mn = layout_utils.reshape_acc_to_mn(thr_s.partition_C(cute.make_identity_tensor((BLOCK, BLOCK))))
        tdS_view = layout_utils.reshape_acc_to_frgA(acc_dP)
        rdS = cute.make_rmem_tensor_like(tdS_view, bf)
        # dS^T (accumulator order) -> dS [q, kv] by stmatrix (transposing)
        copy_dS, _, _ = quack_copy.get_smem_store_C(mma_s, sdSt, wtid, transpose=True, position_independent=True,
                                                     major_mode_size=BLOCK)
        acc_dQ = cute.make_rmem_tensor(thr_dq.partition_shape_C((BLOCK, HEAD_DIM)), Float32)
        tQsdQ = thr_dq.partition_C(sdQ)  # (..., dq stage)
        num_cols = cute.size(acc_dP_mn, mode=[1])
        delta = cute.make_rmem_tensor((num_cols,), Float32)

        bar_kv.wait(0, 0)
        if const_expr(self.kv_regs and not self.zero_pad_v):  # V's padded rows are discarded by select
            self.load_a_regs(mma_s, sV, tPrV, wtid)
        if size < BLOCK:  # K's padded rows to 0 for dQ = dS K (WG1's S^T discards them by select)
            for r in cutlass.range(size, BLOCK, unroll=1):
                sK[r, wtid] = bf(0.0)
                if const_expr(self.zero_pad_v):  # and V's, so that dP^T's rows of padded keys are exact 0s
                    sV[r, wtid] = bf(0.0)
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.barrier(barrier_id=WG2_SYNC, number_of_threads=WG)
        if const_expr(self.kv_regs and self.zero_pad_v):
            self.load_a_regs(mma_s, sV, tPrV, wtid)
        state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.q_stages)
        for t in cutlass.range(count, unroll=1):
            s = state.index
            ps = t % self.p_stages
            d = t % self.dq_stages
            pipe_q.consumer_wait(state)
            pipe_do.consumer_wait(state)
            wgmma_gemm(mma_s, acc_dP, tPrV, tPrdO[None, None, None, s], True)
            for c in cutlass.range_constexpr(num_cols):
                delta[c] = sDelta[tScS_mn[0, c][1], s]
            cute.arch.barrier(barrier_id=P_READY + ps, number_of_threads=2 * WG)
            cute.autovec_copy(self.p_slot(storage, wtid, acc_dP, ps), rP)
            if t + self.p_stages < count:  # WG1 writes this buffer again at step t + p_stages
                cute.arch.barrier_arrive(barrier_id=P_FREE + ps, number_of_threads=2 * WG)
            warpgroup.wait_group(0)
            pipe_do.consumer_release(state)
            dscores_t(rP_mn, acc_dP_mn, tScS_mn, delta, size, select=not self.zero_pad_v)
            rdS.store(tdS_view.load().to(bf))
            if const_expr(self.ds_out):
                cute.arch.barrier(barrier_id=DQ_FREE, number_of_threads=WG + 32)
                copy_dS(rdS)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier_arrive(barrier_id=DQ_FULL, number_of_threads=WG + 32)
                wgmma_gemm(mma_kv, acc_dK, rdS, tKrQt[None, None, None, s], False)
                warpgroup.wait_group(0)
                pipe_q.consumer_release(state)
                state.advance()
            else:
                copy_dS(rdS)
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier(barrier_id=WG2_SYNC, number_of_threads=WG)
                self.gemm_dq(mma_dq, acc_dQ, tQrdS, tQrKt, size)
                wgmma_gemm(mma_kv, acc_dK, rdS, tKrQt[None, None, None, s], False)
                warpgroup.wait_group(1)  # dQ done (dK may still run)
                cute.arch.barrier(barrier_id=DQ_FREE + d, number_of_threads=WG + 32)
                if const_expr(self.flat_dq):
                    self.stage_dq_flat(acc_dQ, storage.sdQ.data_ptr() + d * (BLOCK * HEAD_DIM), wtid)
                else:
                    cute.autovec_copy(acc_dQ, tQsdQ[None, None, None, d])
                cute.arch.fence_proxy("async.shared", space="cta")
                cute.arch.barrier_arrive(barrier_id=DQ_FULL + d, number_of_threads=WG + 32)
                warpgroup.wait_group(0)
                pipe_q.consumer_release(state)
                state.advance()
        if const_expr(self.bulk_dkv):  # into the Q ring, once WG1 (its other reader) is done
            cute.arch.barrier(barrier_id=EPI_SYNC, number_of_threads=2 * WG)
            self.bulk_add_rows(acc_dK, thr_kv, storage.sQ.data_ptr(), mdK, (bh * nb + kv) * BLOCK, size, sm_scale,
                               wtid, WG2_SYNC)
        elif const_expr(self.ticket_dkv):
            self.store_rows_ticket(acc_dK, thr_kv, mdK, (bh * nb + kv) * BLOCK, size, sm_scale, 0, wtid, ticket_args,
                                   (mma_kv, tile_layout, bh * nb + kv, *tma_args))
        else:
            self.store_rows(acc_dK, thr_kv, mdK, (bh * nb + kv) * BLOCK, size, sm_scale,
                            (mma_kv, tile_layout, bh * nb + kv, *tma_args), wtid)

    @cute.jit
    def gemm_dq(self, mma_dq, acc_dQ: cute.Tensor, tQrdS: cute.Tensor, tQrKt: cute.Tensor, size: Int32):
        """dQ = dS K (zero-initialised); with ``narrow_dq`` only its k-steps up to ceil16(size), one
        branch per CTA (every branch defines all of ``acc_dQ``)."""
        if const_expr(not self.narrow_dq):
            wgmma_gemm(mma_dq, acc_dQ, tQrdS, tQrKt, True)
        else:
            step = BLOCK // 4
            if size > 3 * step:
                wgmma_gemm(mma_dq, acc_dQ, tQrdS, tQrKt, True)
            elif size > 2 * step:
                wgmma_gemm(mma_dq, acc_dQ, tQrdS, tQrKt, True, ksteps=3)
            elif size > step:
                wgmma_gemm(mma_dq, acc_dQ, tQrdS, tQrKt, True, ksteps=2)
            else:
                wgmma_gemm(mma_dq, acc_dQ, tQrdS, tQrKt, True, ksteps=1)

    @cute.jit
    def stage_dq_flat(self, acc_dQ: cute.Tensor, tile: cute.Pointer, wtid):
        """``flat_dq``: this thread's 64 dQ accumulator registers into the flat staging ``tile`` (fp32),
        registers ``4 i .. 4 i + 3`` at floats ``512 i + 4 wtid`` (a warp's 128-bit stores cover 512
        contiguous bytes: no bank conflict). Register ``4 i + 2 h + e`` of thread ``t`` (warp ``w``, lane
        ``l``) is dQ's row ``16 w + l // 4 + 8 h``, column ``8 i + 2 (l % 4) + e``
        (``BlockSparseBwd64PostprocessFrag`` reads it back so)."""
        dst = cute.make_tensor(tile + cute.assume(wtid * 4, divby=4), cute.make_layout((4, 16), stride=(1, 4 * WG)))
        src = cute.make_tensor(acc_dQ.iterator, cute.make_layout((4, 16), stride=(1, 4)))
        cute.autovec_copy(src, dst)

    def p_slot(self, storage, wtid, like: cute.Tensor, stage) -> cute.Tensor:
        """This thread's 32 fp32 P^T values in buffer ``stage`` of ``sP``, shaped like the accumulator
        ``like``: element ``i`` at ``(i // 2) * 256 + 2 * wtid + i % 2`` (pairs contiguous: 64-bit
        accesses, a warp's in two wavefronts, no bank conflict)."""
        ptr = storage.sP.data_ptr() + stage * (BLOCK * BLOCK) + wtid * 2
        flat = cute.make_layout((2, BLOCK * BLOCK // WG // 2), stride=(1, 2 * WG))
        return cute.make_tensor(ptr, cute.composition(flat, cute.make_layout(like.shape)))

    @cute.jit
    def load_a_regs(self, tiled_mma, sA: cute.Tensor, tCrA: cute.Tensor, wtid):
        """The A operand of an RS wgmma (``sA`` K-major in shared memory) into its register fragment
        by ldmatrix."""
        atom = cute.make_copy_atom(warp.LdMatrix8x8x16bOp(transpose=False, num_matrices=4), self.dtype)
        thr_copy = cute.make_tiled_copy_A(atom, tiled_mma).get_slice(wtid)
        cute.copy(thr_copy, thr_copy.partition_S(sA), thr_copy.retile(tCrA))

    @cute.jit
    def bulk_add_rows(self, acc, thr_kv, region, mOut, row0: Int32, size: Int32, scale: Float32, wtid, barrier_id):
        """``mOut[row0 : row0 + 64, :] += acc * scale`` (rows of padded keys: + 0) as one 32 KB bulk
        reduce-add: the warpgroup writes its accumulator into ``region`` (shared memory no one reads
        any more) as a row-major fp32 64 x 128 tile, the rows of ``mOut``'s layout, then one thread
        issues the reduction and waits until the TMA unit has read the tile (the CTA may exit then)."""
        sT = cute.make_tensor(cute.recast_ptr(region, dtype=Float32),
                              cute.make_layout((BLOCK, HEAD_DIM), stride=(HEAD_DIM, 1)))
        tS = thr_kv.partition_C(sT)
        cKV = thr_kv.partition_C(cute.make_identity_tensor((BLOCK, HEAD_DIM)))
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            r, c = cKV[i]
            v = acc[i] * scale
            if r >= size:
                v = Float32(0.0)
            tS[i] = v
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier(barrier_id=barrier_id, number_of_threads=WG)
        if wtid == 0:
            bulk_reduce_add_f32(sT.iterator, mOut.iterator + cute.crd2idx((row0, 0), mOut.layout),
                                BLOCK * HEAD_DIM * 4)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    @cute.jit
    def store_rows_ticket(self, acc, thr_kv, mOut, row0: Int32, size: Int32, scale: Float32, tensor: cutlass.Constexpr,
                          wtid, ticket_args, tma_args):
        """``ticket_dkv``'s epilogue: the bf16 rows written once, by this CTA when it is the kv block's only
        group with work, else by the group that finishes last (``last_arrival``)."""
        mWs, mTk, mGB, item, num = ticket_args
        parts = group_parts(mGB, item, num)
        if parts <= 1:
            self.store_rows(acc, thr_kv, mOut, row0, size, scale, tma_args, wtid)
        else:
            if add_rows_last_arrival(acc, scale, parts, mWs, mTk, item, cute.size(mGB.shape[0]), tensor, wtid):
                self.store_rows(acc, thr_kv, mOut, row0, size, Float32(1.0), tma_args, wtid)

    @cute.jit
    def store_rows(self, acc, thr_kv, mOut, row0: Int32, size: Int32, scale: Float32, tma_args=None, wtid=None):
        """``mOut[row0 + r, c] = bf16(acc * scale)``, rows of padded keys (``r >= size``) exactly 0; with
        ``grouped``, ``mOut`` is the fp32 accumulator (zeroed by the caller) and ``acc * scale`` is added
        into it (fp32 reductions; the padded rows are left untouched, 0)."""
        bf = self.dtype
        cKV = thr_kv.partition_C(cute.make_identity_tensor((BLOCK, HEAD_DIM)))
        rOut = cute.make_rmem_tensor_like(acc, bf)
        for i in cutlass.range(cute.size(acc), unroll_full=True):
            r, c = cKV[i]
            v = acc[i] * scale
            if const_expr(self.grouped):
                if r < size:
                    cute.arch.atomic_add(mOut.iterator + cute.crd2idx((row0 + r, c), mOut.layout), v)
            else:
                if r >= size:
                    v = Float32(0.0)
                if const_expr(not self.pair_stores and not self.tma_dkv):
                    mOut[row0 + r, c] = bf(v)
                else:
                    rOut[i] = bf(v)
        if const_expr(self.tma_dkv):
            self.tma_store_rows(rOut, tma_args, wtid)
        elif const_expr(self.pair_stores and not self.grouped):  # adjacent columns' pairs: 32-bit stores
            gOut = cute.make_tensor(mOut.iterator + cute.crd2idx((row0, 0), mOut.layout),
                                    cute.make_layout((BLOCK, HEAD_DIM), stride=(HEAD_DIM, 1)))
            cute.autovec_copy(rOut, thr_kv.partition_C(gOut))

    @cute.jit
    def tma_store_rows(self, rOut: cute.Tensor, tma_args, wtid):
        """``tma_dkv``: this warp's 16 rows of the bf16 tile ``rOut`` (the accumulator's fragment order)
        into the swizzled staging tile by stmatrix, then two TMA stores of 16 x 64 pieces into the kv
        block's rows; the warp's lane 0 waits until the TMA unit has read them."""
        mma_kv, tile_layout, kv_rb, tma_atom, mT, smem = tma_args
        sT = smem.get_tensor(tile_layout.outer, swizzle=tile_layout.inner)
        copy_rows, _, _ = quack_copy.get_smem_store_C(mma_kv, sT, wtid)
        copy_rows(rOut)
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.sync_warp()
        warp = wtid // 32
        if wtid % 32 == 0:
            half = HEAD_DIM // 2
            s16 = cute.flat_divide(sT, (PIECE_ROWS, half))  # (16, 64, row pieces, column halves)
            g16 = cute.flat_divide(mT, (PIECE_ROWS, half))
            ts, tg = cpasync.tma_partition(tma_atom, 0, cute.make_layout(1), cute.group_modes(s16, 0, 2),
                                           cute.group_modes(g16, 0, 2))
            for hh in cutlass.range_constexpr(2):
                cute.copy(tma_atom, ts[None, warp, hh], tg[None, kv_rb * (BLOCK // PIECE_ROWS) + warp, hh])
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)

    # ------------------------------------------------------------------ compilation
    def fake_args(self) -> tuple:
        args = list(main_fake_args(self.dtype, io_align=16, tma_align=128))
        if self.grouped:  # dk, dv: the fp32 accumulators
            args[4] = fake_matrix(Float32, args[4].shape[0], HEAD_DIM, align=16)
            args[5] = fake_matrix(Float32, args[5].shape[0], HEAD_DIM, align=16)
        gb = fake_matrix(Int32, cute.sym_int32(), cute.sym_int32(), align=4)  # [items, groups + 1]
        ws = fake_vector(Float32, cute.sym_int32(), align=16)  # ticket_dkv's workspace (else unused)
        tk = fake_vector(Int32, cute.sym_int32(), align=4)  # and its counters
        return (*args[:13], gb, ws, tk, *args[13:])
