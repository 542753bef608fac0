# SPDX-License-Identifier: Apache-2.0
"""The sm_90a 64-token forward walking its list two entries a step (``pair_steps``; CuTe DSL).

What it computes: what :mod:`.block_sparse_fwd64_sm90` computes (its module docstring: the q2k
lists, or with ``packed_steps`` the packed step lists; out and the natural-log LSE; padding masked
in the kernel, NaN/Inf there never reaches the output; empty rows out 0 and LSE -inf), with the
sum over a row's keys taken in pairs of list entries, so out differs from the one-entry build by
rounding only.

Why: the one-entry forward is bound by the length of each warpgroup's instruction chain (~310
instructions a 64-key step, docs/hopper-64-token.md), much of it a step's fixed cost (barrier
waits, list reads, the wgmma fences and waits, the row-max vote and the rescale branch). Taking two
entries a step (128 keys: S = Q [K_a; K_b]^T as two 64x64 wgmma groups in one commit, one online
softmax over the 128 scores of a row, O += P_a V_a + P_b V_b as eight k-steps in one commit) pays
that fixed cost once per 128 keys.

How (one CTA per (query tile, head, batch), one warpgroup, two CTAs per SM, ``min_blocks_per_mp=2``):
  - Q (64 x D) arrives by TMA into the first V tile's buffer and is loaded into registers once
    (ldmatrix), so S is an RS wgmma and Q needs no shared memory of its own: K has one slot of two
    64-key tiles, V a ring of two such slots (96 KB at D = 128: two CTAs per SM fit);
  - step t (entries 2t, 2t+1; the second missing when the count is odd: its keys are 0, so its
    scores are masked and its P V k-steps not issued): V[t]'s tiles are issued, S[t] is issued,
    O += P[t-1] V[t-1] behind it; when S[t] retires K[t+1]'s tiles go into the freed slot, each
    half's keys past its valid count are masked (a select), the online softmax (lazy rescale and
    its vote) runs over 2 x 32 scores a thread while P V[t-1] computes, and after P V[t-1] retires
    S[t] becomes P[t] (``pv_overlap=False``: both wgmma groups retire before the softmax, which then
    overlaps only the other CTA's wgmmas; ptxas does not know that an in-flight RS wgmma reads P's
    registers, so the overlapped build reads P once after the wait on a never-taken branch to keep
    the softmax's results off them);
  - V pair t uses ring slot ``(t + 1) % 2``: slot 1 takes pair 0 in the prologue, slot 0 (where Q
    landed) takes pair 1 only after every thread has read Q into registers (one CTA barrier);
  - a partial tile zeroes its V padding rows (16-byte stores, a proxy fence and a CTA barrier; only
    for counts that are not a multiple of 16); a pair with a partial tile issues only the P V
    k-steps of valid keys (a branch per k-step), a pair of full tiles one group of eight;
  - the epilogue normalises O, writes the LSE, stages O in K's first tile buffer (every S has
    retired) and stores it by TMA.

Not in this build (the one-entry kernel serves them): the fused gate, ``out_s``, the kv-range merge,
``partial_loads``, ``narrow_tiles`` (its softmax always runs over all 32 columns of a row part).
Layouts and arguments: the one-entry kernel's (``(q, k, v, out, lse, idx, num, sizes, None, None,
None, None, scale)``). head_dim 64 or 128, fp16/bf16.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.memory
import cutlass.pipeline as pipeline
import cutlass.utils.hopper_helpers as sm90_helpers
from cutlass import Float32, Int32, const_expr
from cutlass.cute.nvgpu import OperandMajorMode, cpasync, warpgroup
from quack import layout_utils

from ..common.softmax import finalize_row, mask_keys_mn, mask_keys_pieces_mn, online_softmax_rows
from .block_sparse_fwd64_sm90 import (BLOCK, PV_STEP, RESCALE_THRESHOLD, SMEM_PER_SM, SMEM_RESERVED_PER_CTA,
                                      STEP_KEYS_MASK, STEP_WORDS, THREADS, BlockSparseFwd64Sm90, _CUTE_DTYPES,
                                      _uniform_base)

__all__ = ["BlockSparseFwd64Sm90Pairs", "pairs_smem_bytes"]

HALVES = 2  # list entries (64-key tiles) a step
V_SLOTS = 2  # V's ring: pair slots


def pairs_smem_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one CTA: K's slot and V's two slots (two 64 x D tiles each, 2 B an
    element; Q lands in V's first tile), barriers and the 1 KB alignment slack."""
    return BLOCK * head_dim * 2 * HALVES * (1 + V_SLOTS) + 8 * (1 + HALVES + HALVES * V_SLOTS) + 1024


class BlockSparseFwd64Sm90Pairs(BlockSparseFwd64Sm90):
    """The pair-step build of the sm_90a 64-token forward (module docstring). Built by
    ``sm90_kernel(..., pair_steps=True)``; called as the one-entry kernel."""

    name = "block_sparse_fwd64_sm90"

    def __init__(self, dtype: str = "bfloat16", head_dim: int = 128, *, has_block_sizes: bool = True,
                 fuse_gate: bool = False, store_out_s: bool = False, merge_prev: bool = False,
                 partial_loads: bool = False, packed_steps: bool = False, lazy_rescale: bool = True,
                 lazy_vote=None, ctas_per_sm: int = 2, pair_steps: bool = True, pv_overlap: bool = True, **unused):
        for key, val in (("fuse_gate", fuse_gate), ("store_out_s", store_out_s), ("merge_prev", merge_prev),
                         ("partial_loads", partial_loads)):
            if val:
                raise ValueError(f"pair_steps does not take {key} (the one-entry build serves it)")
        if not pair_steps:
            raise ValueError("BlockSparseFwd64Sm90Pairs is the pair_steps build")
        if ctas_per_sm not in (1, 2):
            raise ValueError(f"pair_steps runs one or two CTAs per SM, got ctas_per_sm={ctas_per_sm!r}")
        for key in unused:  # the one-entry build's pipeline options have no meaning here
            if key not in ("k_stages", "v_stages", "q_regs", "narrow_tiles", "stmatrix_epilogue"):
                raise TypeError(f"unexpected keyword {key!r}")
        super().__init__(dtype, head_dim, has_block_sizes=has_block_sizes, lazy_rescale=lazy_rescale,
                         lazy_vote=lazy_vote, packed_steps=packed_steps, narrow_tiles=False, ctas_per_sm=1)
        need = ctas_per_sm * (pairs_smem_bytes(self.head_dim) + SMEM_RESERVED_PER_CTA)
        if need > SMEM_PER_SM:
            raise ValueError(f"pair_steps at head_dim {head_dim} needs {need} B of shared memory for {ctas_per_sm} "
                             f"CTAs per SM; the SM has {SMEM_PER_SM}")
        self.ctas_per_sm = int(ctas_per_sm)
        self.q_regs = self.head_dim
        self.pv_overlap = bool(pv_overlap)

    def config(self) -> Mapping[str, Any]:
        return {"dtype": self.dtype_name, "head_dim": self.head_dim, "has_block_sizes": self.has_block_sizes,
                "pair_steps": True, "ctas_per_sm": self.ctas_per_sm, "lazy_rescale": self.lazy_rescale,
                "lazy_vote": self.lazy_vote, "packed_steps": self.packed_steps, "pv_overlap": self.pv_overlap}

    # ------------------------------------------------------------------ host side
    @cute.jit
    def __call__(self, mQ: cute.Tensor, mK: cute.Tensor, mV: cute.Tensor, mO: cute.Tensor, mLSE: cute.Tensor,
                 mIdx: cute.Tensor, mNum: cute.Tensor, mSizes, mGate, mOutC, mOs, mPrevO, softmax_scale: Float32,
                 stream: cuda.CUstream):
        d = self.head_dim
        dt = _CUTE_DTYPES[self.dtype_name]

        def static_dim(t: cute.Tensor, mode: int) -> cute.Tensor:
            shape = tuple(d if i == mode else t.shape[i] for i in range(4))
            return cute.make_tensor(t.iterator, cute.make_layout(shape, stride=t.stride))

        mQ, mK, mO, mV = static_dim(mQ, 1), static_dim(mK, 1), static_dim(mO, 1), static_dim(mV, 0)
        k_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.K_SW128, dt)
        mn_atom = warpgroup.make_smem_layout_atom(warpgroup.SmemLayoutAtomKind.MN_SW128, dt)
        sQ_layout = cute.tile_to_shape(k_atom, (BLOCK, d), order=(0, 1))
        sK_layout = cute.tile_to_shape(k_atom, (BLOCK, d, HALVES), order=(0, 1, 2))
        sK_one = cute.slice_(sK_layout, (None, None, 0))
        sV_layout = cute.tile_to_shape(mn_atom, (d, BLOCK, HALVES * V_SLOTS), order=(1, 0, 2))
        sV_one = cute.slice_(sV_layout, (None, None, 0))

        g2s = cpasync.CopyBulkTensorTileG2SOp()
        tma_atom_Q, tma_Q = cpasync.make_tiled_tma_atom(g2s, mQ, sQ_layout, (BLOCK, d))
        tma_atom_K, tma_K = cpasync.make_tiled_tma_atom(g2s, mK, sK_one, (BLOCK, d))
        tma_atom_V, tma_V = cpasync.make_tiled_tma_atom(g2s, mV, sV_one, (d, BLOCK))
        tma_atom_O, tma_O = cpasync.make_tiled_tma_atom(cpasync.CopyBulkTensorTileS2GOp(), mO, sQ_layout, (BLOCK, d))
        if const_expr(self.packed_steps):  # 16-key pieces (x 64 columns) of K and V
            hd = min(d, 64)
            sK_piece = cute.tile_to_shape(k_atom, (PV_STEP, hd), order=(0, 1))
            sV_piece = cute.tile_to_shape(mn_atom, (hd, PV_STEP), order=(1, 0))
            tma_atom_K16, tma_K16 = cpasync.make_tiled_tma_atom(g2s, mK, sK_piece, (PV_STEP, hd))
            tma_atom_V16, tma_V16 = cpasync.make_tiled_tma_atom(g2s, mV, sV_piece, (hd, PV_STEP))
        else:
            tma_atom_K16, tma_K16, tma_atom_V16, tma_V16 = tma_atom_K, tma_K, tma_atom_V, tma_V  # never used

        # S = Q K^T per 64-key half, Q from registers; the (64, 128) tiling only shapes the pair's
        # accumulator (its first 32 values per thread are half a's 64 columns, the next 32 half b's)
        mma_qk = sm90_helpers.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                     (1, 1, 1), tiler_mn=(BLOCK, BLOCK),
                                                     a_source=warpgroup.OperandSource.RMEM)
        mma_pair = sm90_helpers.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.K, Float32,
                                                       (1, 1, 1), tiler_mn=(BLOCK, HALVES * BLOCK),
                                                       a_source=warpgroup.OperandSource.RMEM)
        mma_pv = sm90_helpers.make_trivial_tiled_mma(dt, dt, OperandMajorMode.K, OperandMajorMode.MN, Float32,
                                                     (1, 1, 1), tiler_mn=(BLOCK, d),
                                                     a_source=warpgroup.OperandSource.RMEM)

        @cute.struct
        class SharedStorage:
            bar_q: cute.struct.MemRange[cutlass.Int64, 1]
            bar_k: cute.struct.MemRange[cutlass.Int64, HALVES]
            bar_v: cute.struct.MemRange[cutlass.Int64, HALVES * V_SLOTS]
            sK: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sK_layout)], 1024]
            sV: cute.struct.Align[cute.struct.MemRange[dt, cute.cosize(sV_layout)], 1024]

        scale_log2 = softmax_scale * Float32(math.log2(math.e))
        grid = (cute.ceil_div(mQ.shape[0], BLOCK), mQ.shape[2], mQ.shape[3])
        sizes = mSizes if const_expr(self.has_block_sizes) else mNum  # a placeholder never read
        self.kernel(
            tma_atom_Q, tma_Q, tma_atom_K, tma_K, tma_atom_V, tma_V, tma_atom_O, tma_O, tma_atom_K16, tma_K16,
            tma_atom_V16, tma_V16, mLSE, mIdx, mNum, sizes, sQ_layout, sK_layout, sV_layout, mma_qk, mma_pair,
            mma_pv, scale_log2, SharedStorage,
        ).launch(grid=grid, block=(THREADS, 1, 1), smem=SharedStorage.size_in_bytes(), stream=stream,
                 min_blocks_per_mp=self.ctas_per_sm, preferred_smem_carveout=100)

    # ------------------------------------------------------------------ device side
    @cute.jit
    def half_info(self, gIdx: cute.Tensor, mSizes, p: Int32, count: Int32, seqlen_k: Int32, st: cute.Tensor):
        """List position ``p``'s kv tile (unpacked lists) and its valid keys (0 past the count); with
        ``packed_steps`` the step's words go into ``st`` (all 0 past the count) and the tile is 0."""
        n = Int32(0)
        keys = Int32(0)
        if const_expr(self.packed_steps):
            for c in cutlass.range_constexpr(STEP_WORDS):
                st[c] = Int32(0)
            if p < count:
                for c in cutlass.range_constexpr(STEP_WORDS):
                    st[c] = gIdx[p * STEP_WORDS + c]
            keys = self.step_keys(st)
        else:
            if p < count:
                n = gIdx[p]
                keys = self.tile_keys(mSizes, n, seqlen_k)
        return n, keys

    @cute.jit
    def load_half(self, tma_atom, tXgX, tXsX, pieces16, bar, tx_bytes: cutlass.Constexpr, slot: Int32, n: Int32,
                  st: cute.Tensor, is_v: cutlass.Constexpr):
        """(warp 0) One half of a pair into buffer ``slot``: tile ``n``, or the packed step ``st``."""
        if const_expr(self.packed_steps):
            self.load_step(tma_atom, tXgX, tXsX, pieces16, bar, tx_bytes, slot, st, is_v)
        else:
            self.load_tile(tma_atom, tXgX, tXsX, bar, tx_bytes, slot, n)

    @cute.jit
    def mask_half(self, acc_h: cute.Tensor, tScS: cute.Tensor, keys: Int32, st: cute.Tensor):
        """Scores of a half's keys past its valid ones -> -inf (a ragged packed piece: per piece)."""
        s_mn = layout_utils.reshape_acc_to_mn(acc_h)
        if const_expr(self.packed_steps):
            if self.step_ragged(st):
                piece_keys = cute.make_rmem_tensor((STEP_WORDS,), Int32)
                for c in cutlass.range_constexpr(STEP_WORDS):
                    piece_keys[c] = st[c] & STEP_KEYS_MASK
                mask_keys_pieces_mn(s_mn, tScS, piece_keys, piece=PV_STEP)
            elif keys < BLOCK:
                mask_keys_mn(s_mn, tScS, keys)
        elif keys < BLOCK:
            mask_keys_mn(s_mn, tScS, keys)

    @cute.jit
    def zero_half_padding(self, sV: cute.Tensor, slot: Int32, keys: Int32, st: cute.Tensor, tidx: Int32):
        """V padding rows of buffer ``slot`` that a P V k-step reads -> 0 (only where needed)."""
        if const_expr(self.packed_steps):
            if self.step_ragged(st):
                self.zero_v_pieces(sV, slot, st, tidx)
        elif keys % PV_STEP != 0:
            self.zero_v_padding(sV, slot, keys, tidx)

    @cute.jit
    def gemm_pv_pair(self, tiled_mma: cute.TiledMma, acc: cute.Tensor, rP: cute.Tensor, tOrV: cute.Tensor,
                     slot_a: Int32, keys_a: Int32, keys_b: Int32):
        """O += P_a V_a + P_b V_b: eight k-steps in one group for two full tiles, else only the
        k-steps (16 keys) of each half that hold a valid key (a branch per k-step)."""
        per = BLOCK // PV_STEP
        warpgroup.fence()
        atom = cute.make_mma_atom(tiled_mma.op)
        atom.set(warpgroup.Field.ACCUMULATE, True)
        if keys_a == BLOCK and keys_b == BLOCK:
            for k in cutlass.range_constexpr(HALVES * per):
                cute.gemm(atom, acc, rP[None, None, k], tOrV[None, None, k % per, slot_a + k // per], acc)
        else:
            for k in cutlass.range_constexpr(per):
                if k * PV_STEP < keys_a:
                    cute.gemm(atom, acc, rP[None, None, k], tOrV[None, None, k, slot_a], acc)
            for k in cutlass.range_constexpr(per):
                if k * PV_STEP < keys_b:
                    cute.gemm(atom, acc, rP[None, None, per + k], tOrV[None, None, k, slot_a + 1], acc)
        warpgroup.commit_group()

    @cute.jit
    def gemm_s_pair(self, mma_qk: cute.TiledMma, acc_a: cute.Tensor, acc_b: cute.Tensor, tSrQ: cute.Tensor,
                    tSrK: cute.Tensor):
        """S = Q [K_a; K_b]^T: both halves' k-steps (Q from registers) in one commit group."""
        warpgroup.fence()
        for h in cutlass.range_constexpr(HALVES):
            atom = cute.make_mma_atom(mma_qk.op)
            atom.set(warpgroup.Field.ACCUMULATE, False)
            acc = acc_a if const_expr(h == 0) else acc_b
            for k in cutlass.range_constexpr(self.head_dim // PV_STEP):
                cute.gemm(atom, acc, tSrQ[None, None, k], tSrK[None, None, k, h], acc)
                atom.set(warpgroup.Field.ACCUMULATE, True)
        warpgroup.commit_group()

    @cute.kernel
    def kernel(self, tma_atom_Q: cute.CopyAtom, mQ: cute.Tensor, tma_atom_K: cute.CopyAtom, mK: cute.Tensor,
               tma_atom_V: cute.CopyAtom, mV: cute.Tensor, tma_atom_O: cute.CopyAtom, mO: cute.Tensor,
               tma_atom_K16: cute.CopyAtom, mK16: cute.Tensor, tma_atom_V16: cute.CopyAtom, mV16: cute.Tensor,
               mLSE: cute.Tensor, mIdx: cute.Tensor, mNum: cute.Tensor, mSizes,
               sQ_layout: cute.ComposedLayout, sK_layout: cute.ComposedLayout, sV_layout: cute.ComposedLayout,
               mma_qk: cute.TiledMma, mma_pair: cute.TiledMma, mma_pv: cute.TiledMma, scale_log2: Float32,
               SharedStorage: cutlass.Constexpr):
        d = self.head_dim
        dt = _CUTE_DTYPES[self.dtype_name]
        tidx, _, _ = cute.arch.thread_idx()
        qt, h, b = cute.arch.block_idx()
        qt = cute.arch.make_warp_uniform(qt)
        h = cute.arch.make_warp_uniform(h)
        b = cute.arch.make_warp_uniform(b)
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        seqlen_q = mQ.shape[0]
        seqlen_k = mK.shape[0]
        width = mIdx.shape[0]
        tx_q = cute.size_in_bytes(dt, sQ_layout)
        tx_k = cute.size_in_bytes(dt, cute.slice_(sK_layout, (None, None, 0)))
        tx_v = cute.size_in_bytes(dt, cute.slice_(sV_layout, (None, None, 0)))

        if warp_idx == 0:
            for atom in (tma_atom_Q, tma_atom_K, tma_atom_V, tma_atom_O):
                cpasync.prefetch_descriptor(atom)
            if const_expr(self.packed_steps):
                cpasync.prefetch_descriptor(tma_atom_K16)
                cpasync.prefetch_descriptor(tma_atom_V16)

        storage = cutlass.memory.SmemAllocator().allocate(SharedStorage)
        tma_op = pipeline.PipelineOp.TmaLoad
        one = pipeline.CooperativeGroup(pipeline.Agent.Thread)
        bar_q = pipeline.MbarrierArray(storage.bar_q.data_ptr(), num_stages=1, agent=(tma_op, one))
        bar_k = pipeline.MbarrierArray(storage.bar_k.data_ptr(), num_stages=HALVES, agent=(tma_op, one))
        bar_v = pipeline.MbarrierArray(storage.bar_v.data_ptr(), num_stages=HALVES * V_SLOTS, agent=(tma_op, one))
        cute.arch.mbarrier_init_fence()

        sK = storage.sK.get_tensor(sK_layout.outer, swizzle=sK_layout.inner)
        sV = storage.sV.get_tensor(sV_layout.outer, swizzle=sV_layout.inner)
        sQ = storage.sV.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # V's first tile, until step 1
        sO = storage.sK.get_tensor(sQ_layout.outer, swizzle=sQ_layout.inner)  # K's first tile, in the epilogue

        gQ = cute.local_tile(mQ[None, None, h, b], (BLOCK, d), (qt, 0))
        gK = cute.local_tile(mK[None, None, h, b], (BLOCK, d), (None, 0))
        gV = cute.local_tile(mV[None, None, h, b], (d, BLOCK), (0, None))
        gO = cute.local_tile(mO[None, None, h, b], (BLOCK, d), (qt, 0))
        unit = cute.make_layout(1)
        tQsQ, tQgQ = cpasync.tma_partition(tma_atom_Q, 0, unit, cute.group_modes(sQ, 0, 2), cute.group_modes(gQ, 0, 2))
        tKsK, tKgK = cpasync.tma_partition(tma_atom_K, 0, unit, cute.group_modes(sK, 0, 2), cute.group_modes(gK, 0, 2))
        tVsV, tVgV = cpasync.tma_partition(tma_atom_V, 0, unit, cute.group_modes(sV, 0, 2), cute.group_modes(gV, 0, 2))
        k16 = v16 = None
        if const_expr(self.packed_steps):
            hd = min(d, 64)
            sK16 = cute.flat_divide(sK, (PV_STEP, hd))
            gK16 = cute.flat_divide(mK16[None, None, h, b], (PV_STEP, hd))
            sV16 = cute.flat_divide(sV, (hd, PV_STEP))
            gV16 = cute.flat_divide(mV16[None, None, h, b], (hd, PV_STEP))
            tK16s, tK16g = cpasync.tma_partition(tma_atom_K16, 0, unit, cute.group_modes(sK16, 0, 2),
                                                 cute.group_modes(gK16, 0, 2))
            tV16s, tV16g = cpasync.tma_partition(tma_atom_V16, 0, unit, cute.group_modes(sV16, 0, 2),
                                                 cute.group_modes(gV16, 0, 2))
            k16, v16 = (tma_atom_K16, tK16g, tK16s), (tma_atom_V16, tV16g, tV16s)

        thr_qk = mma_qk.get_slice(tidx)
        thr_pair = mma_pair.get_slice(tidx)
        thr_pv = mma_pv.get_slice(tidx)
        tSrQ = thr_qk.make_fragment_A(thr_qk.partition_A(sQ))
        tSrK = thr_qk.make_fragment_B(thr_qk.partition_B(sK))  # (..., halves)
        tOrV = thr_pv.make_fragment_B(thr_pv.partition_B(sV))  # (..., halves x slots)
        acc_S = cute.make_rmem_tensor(thr_pair.partition_shape_C((BLOCK, HALVES * BLOCK)), Float32)
        half_layout = cute.make_layout(thr_qk.partition_shape_C((BLOCK, BLOCK)))
        half_vals = cute.size(half_layout)
        acc_a = cute.make_tensor(acc_S.iterator, half_layout)
        acc_b = cute.make_tensor(acc_S.iterator + half_vals, half_layout)
        acc_O = cute.make_rmem_tensor(thr_pv.partition_shape_C((BLOCK, d)), Float32)
        acc_O.fill(0.0)
        tScS = layout_utils.reshape_acc_to_mn(thr_qk.partition_C(cute.make_identity_tensor((BLOCK, BLOCK))))
        tP_view = layout_utils.reshape_acc_to_frgA(acc_S)
        rP = cute.make_rmem_tensor_like(tP_view, dt)
        acc_S_mn = layout_utils.reshape_acc_to_mn(acc_S)
        acc_O_mn = layout_utils.reshape_acc_to_mn(acc_O)
        num_rows = cute.size(acc_O_mn, mode=[0])
        row_max = cute.make_rmem_tensor((num_rows,), Float32)
        row_sum = cute.make_rmem_tensor((num_rows,), Float32)
        alpha = cute.make_rmem_tensor((num_rows,), Float32)
        neg_scaled = cute.make_rmem_tensor((num_rows,), Float32)
        neg_scaled.fill(0.0)
        row_max.fill(-Float32.inf)
        row_sum.fill(0.0)
        alpha.fill(1.0)
        # (packed_steps) each half's step words: this pair's, the pair before's (its V padding) and the next's
        st_a, st_b, st_pa, st_pb, st_na, st_nb = (cute.make_rmem_tensor((STEP_WORDS,), Int32) for _ in range(6))

        cute.arch.barrier()  # barrier initialisation visible to every waiting thread
        if warp_idx == 0:
            bar_q.arrive_and_expect_tx(0, tx_q)
            cute.copy(tma_atom_Q, tQgQ, tQsQ, tma_bar_ptr=bar_q.get_barrier(0))
        gIdx = _uniform_base(mIdx[None, qt, h, b])
        if const_expr(self.packed_steps):
            width = width // STEP_WORDS
        count = cutlass.min(cutlass.max(mNum[qt, h, b], Int32(0)), width)
        pairs = (count + 1) // HALVES

        if count > 0:
            n_a, keys_a = self.half_info(gIdx, mSizes, Int32(0), count, seqlen_k, st_a)
            n_b, keys_b = self.half_info(gIdx, mSizes, Int32(1), count, seqlen_k, st_b)
            if warp_idx == 0:  # K[0] into K's slot, V[0] into V's slot 1 (slot 0 holds Q)
                self.load_half(tma_atom_K, tKgK, tKsK, k16, bar_k, tx_k, Int32(0), n_a, st_a, False)
                self.load_half(tma_atom_V, tVgV, tVsV, v16, bar_v, tx_v, Int32(HALVES), n_a, st_a, True)
                if count > 1:
                    self.load_half(tma_atom_K, tKgK, tKsK, k16, bar_k, tx_k, Int32(1), n_b, st_b, False)
                    self.load_half(tma_atom_V, tVgV, tVsV, v16, bar_v, tx_v, Int32(HALVES + 1), n_b, st_b, True)
            n_na, keys_na = self.half_info(gIdx, mSizes, Int32(2), count, seqlen_k, st_na)
            n_nb, keys_nb = self.half_info(gIdx, mSizes, Int32(3), count, seqlen_k, st_nb)

            # ---- step 0: Q into registers, S[0], no P V yet
            bar_q.wait(0, 0)
            self.load_q_regs(mma_qk, sQ, tSrQ, tidx)
            cute.arch.barrier()  # every thread has read Q: V's slot 0 may take pair 1 (at step 1)
            bar_k.wait(0, 0)
            if count > 1:
                bar_k.wait(1, 0)
            self.gemm_s_pair(mma_qk, acc_a, acc_b, tSrQ, tSrK)
            warpgroup.wait_group(0)
            if warp_idx == 0 and count > HALVES:  # K[1] into the slot S[0] freed
                self.load_half(tma_atom_K, tKgK, tKsK, k16, bar_k, tx_k, Int32(0), n_na, st_na, False)
                if count > HALVES + 1:
                    self.load_half(tma_atom_K, tKgK, tKsK, k16, bar_k, tx_k, Int32(1), n_nb, st_nb, False)
            self.mask_half(acc_a, tScS, keys_a, st_a)
            self.mask_half(acc_b, tScS, keys_b, st_b)
            online_softmax_rows(acc_S_mn, row_max, row_sum, alpha, scale_log2, threads_in_group=4,
                                rescale_threshold=RESCALE_THRESHOLD if const_expr(self.lazy_rescale) else None,
                                vote_kept=self.lazy_vote, neg_scaled_state=neg_scaled)
            if const_expr(not self.lazy_rescale):
                self.rescale_o(acc_O_mn, alpha, num_rows)  # (O is 0 here; kept for the eager build's order)
            rP.store(tP_view.load().to(dt))

            # ---- steps 1 .. pairs-1: S[t] in flight with P V[t-1]
            for t in cutlass.range(1, pairs, unroll=1):
                keys_pa, keys_pb = keys_a, keys_b
                n_a, n_b, keys_a, keys_b = n_na, n_nb, keys_na, keys_nb
                if const_expr(self.packed_steps):
                    for c in cutlass.range_constexpr(STEP_WORDS):
                        st_pa[c] = st_a[c]
                        st_pb[c] = st_b[c]
                        st_a[c] = st_na[c]
                        st_b[c] = st_nb[c]
                n_na, keys_na = self.half_info(gIdx, mSizes, HALVES * (t + 1), count, seqlen_k, st_na)
                n_nb, keys_nb = self.half_info(gIdx, mSizes, HALVES * (t + 1) + 1, count, seqlen_k, st_nb)
                vslot = HALVES * ((t + 1) % V_SLOTS)
                if warp_idx == 0:  # V[t] into its slot, whose P V (pair t - 2) retired at step t - 1
                    self.load_half(tma_atom_V, tVgV, tVsV, v16, bar_v, tx_v, vslot, n_a, st_a, True)
                    if HALVES * t + 1 < count:
                        self.load_half(tma_atom_V, tVgV, tVsV, v16, bar_v, tx_v, vslot + 1, n_b, st_b, True)
                bar_k.wait(0, t % 2)
                if HALVES * t + 1 < count:
                    bar_k.wait(1, t % 2)
                self.gemm_s_pair(mma_qk, acc_a, acc_b, tSrQ, tSrK)
                if const_expr(not self.lazy_rescale):
                    self.rescale_o(acc_O_mn, alpha, num_rows)
                prev = HALVES * (t % V_SLOTS)
                ph = ((t - 1) // V_SLOTS) % 2
                bar_v.wait(prev, ph)
                bar_v.wait(prev + 1, ph)  # (the pair before this one is never the odd last)
                self.zero_half_padding(sV, prev, keys_pa, st_pa, tidx)
                self.zero_half_padding(sV, prev + 1, keys_pb, st_pb, tidx)
                self.gemm_pv_pair(mma_pv, acc_O, rP, tOrV, prev, keys_pa, keys_pb)
                if const_expr(self.pv_overlap):
                    warpgroup.wait_group(1)  # S[t] retired; P V[t-1] may still run
                else:
                    warpgroup.wait_group(0)  # both retired: the softmax runs beside the other CTA's wgmmas
                if warp_idx == 0 and HALVES * (t + 1) < count:
                    self.load_half(tma_atom_K, tKgK, tKsK, k16, bar_k, tx_k, Int32(0), n_na, st_na, False)
                    if HALVES * (t + 1) + 1 < count:
                        self.load_half(tma_atom_K, tKgK, tKsK, k16, bar_k, tx_k, Int32(1), n_nb, st_nb, False)
                self.mask_half(acc_a, tScS, keys_a, st_a)
                self.mask_half(acc_b, tScS, keys_b, st_b)
                moved = online_softmax_rows(acc_S_mn, row_max, row_sum, alpha, scale_log2, threads_in_group=4,
                                            rescale_threshold=RESCALE_THRESHOLD if const_expr(self.lazy_rescale)
                                            else None, vote_kept=self.lazy_vote, neg_scaled_state=neg_scaled)
                if const_expr(self.pv_overlap):
                    warpgroup.wait_group(0)  # P V[t-1] retired: P's registers are free
                    if seqlen_k < 0:  # never taken: P[t-1] is read here, so ptxas keeps its registers (the
                        # in-flight P V's A operand) out of the softmax above (it does not know the wgmma reads them)
                        cute.autovec_copy(rP, cute.make_tensor(storage.sK.data_ptr(), rP.layout))
                if const_expr(self.lazy_rescale):
                    if const_expr(self.lazy_vote):
                        if moved:
                            self.rescale_o(acc_O_mn, alpha, num_rows)
                    else:
                        self.rescale_o(acc_O_mn, alpha, num_rows)
                rP.store(tP_view.load().to(dt))

            # ---- drain: P V[pairs-1]
            last = HALVES * (pairs % V_SLOTS)
            ph = ((pairs - 1) // V_SLOTS) % 2
            bar_v.wait(last, ph)
            if HALVES * (pairs - 1) + 1 < count:
                bar_v.wait(last + 1, ph)
            self.zero_half_padding(sV, last, keys_a, st_a, tidx)
            self.zero_half_padding(sV, last + 1, keys_b, st_b, tidx)
            self.gemm_pv_pair(mma_pv, acc_O, rP, tOrV, last, keys_a, keys_b)
            warpgroup.wait_group(0)
        else:
            bar_q.wait(0, 0)  # Q's load has landed before the CTA leaves

        # ---- epilogue: normalise, LSE, O through K's first tile buffer by TMA
        tOcO_mn = layout_utils.reshape_acc_to_mn(thr_pv.partition_C(cute.make_identity_tensor((BLOCK, d))))
        st_atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), dt, num_bits_per_copy=32)
        thr_copy_O = cute.make_tiled_copy_C(st_atom, mma_pv).get_slice(tidx)
        num_cols = cute.size(acc_O_mn, mode=[1])
        for r in cutlass.range_constexpr(num_rows):
            total = cute.arch.warp_reduction_sum(row_sum[r], threads_in_group=4)
            inv, lse, empty = finalize_row(row_max[r], total, scale_log2)
            for c in cutlass.range_constexpr(num_cols):
                acc_O_mn[r, c] = Float32(0.0) if empty else acc_O_mn[r, c] * inv
            row = qt * BLOCK + tOcO_mn[r, 0][0]
            if tOcO_mn[r, 0][1] == 0 and row < seqlen_q:
                mLSE[row, h, b] = lse
        rO = cute.make_rmem_tensor_like(acc_O, dt)
        rO.store(acc_O.load().to(dt))
        cute.arch.barrier()  # every warp's wgmma reads of K are done before its buffer takes O
        cute.copy(thr_copy_O, thr_copy_O.retile(rO), thr_copy_O.partition_D(sO))
        cute.arch.fence_proxy("async.shared", space="cta")
        cute.arch.barrier()
        if warp_idx == 0:
            tOsO, tOgO = cpasync.tma_partition(tma_atom_O, 0, unit, cute.group_modes(sO, 0, 2),
                                               cute.group_modes(gO, 0, 2))
            cute.copy(tma_atom_O, tOsO, tOgO)
            cute.arch.cp_async_bulk_commit_group()
            cute.arch.cp_async_bulk_wait_group(0, read=True)
