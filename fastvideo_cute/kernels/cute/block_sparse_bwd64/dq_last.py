# SPDX-License-Identifier: Apache-2.0
"""bf16 dq written by the main kernel, no postprocess (the warp-specialized Hopper backward's
``dq_last``; device side only, no torch).

Every CTA adds its dQ tiles into ``dq_accum`` (fp32, register order) by bulk reduce-adds; the q block's
bf16 rows can be written once all of the CTAs that add into it have completed theirs. Each q block has
a count (``mQc``, int32, set by the caller to its q2k count: the number of CTAs that add into it):

    store warp (lane 0)   after step t's reduction is issued, waits for step t - lag's to complete
                          (``cp.async.bulk.wait_group lag``), orders it for the generic proxy
                          (``fence.proxy.async.global``) and sends that q block through an 8-slot
                          mbarrier ring (``send_done``); the last ``lag`` steps after its loop
    warp 2 (converting)   per message, lane 0 counts the block down (one gpu-scope acq_rel atomic;
                          the store warp's completion reaches it through the mbarrier, and the release
                          is cumulative over it); the warp whose arrival took the count to 0 converts the
                          tile: acquire fence, ``dq = dtype(dq_accum * sm_scale)``, rows with
                          ``lse2 == +inf`` (no valid key) exactly 0 (``convert_last``)

No CTA waits on another (the last arrival converts, nobody spins), so no deadlock in any CTA order.
The count-down is not the store warp's: its release is a ``MEMBAR``, which there also waited for the
bulk reductions still in flight (Nsight Compute on the H200, 2026-12-06: the kernel ran 1.6x longer
with the atomic in the store warp, whatever the lag). q blocks no CTA adds into are the caller's to
zero (the preprocess's ``zero_dq``).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
from cutlass import Float32, Int32

from .block_sparse_bwd64_common import frag_tile_to_rows

__all__ = ["CONV_STAGES", "CONV_SMEM", "send_done", "convert_last"]

CONV_STAGES = 8  # the store warp's messages in flight to the converting warp
CONV_SMEM = CONV_STAGES * (2 * 8 + 4) + 64  # their mbarriers and slots, with alignment


@cute.jit
def send_done(pipe_cv, slots: cute.Tensor, state_cv, rb):
    """Store warp, lane 0: this CTA's reduction into q block ``rb`` has completed (the caller waited on
    its bulk group): order it for the generic proxy and send ``rb`` (the caller advances ``state_cv``)."""
    cute.arch.fence_proxy("async.global")
    pipe_cv.producer_acquire(state_cv)
    slots[state_cv.index] = rb
    pipe_cv.producer_commit(state_cv)


@cute.jit
def convert_last(mdQaccum: cute.Tensor, mLSE2: cute.Tensor, mdQ: cute.Tensor, slots: cute.Tensor, pipe_cv,
                 mQc: cute.Tensor, sm_scale: Float32, count, dtype: cutlass.Constexpr):
    """The converting warp (one warp): take ``count`` messages, count each q block down and convert the
    blocks whose last arrival this was (``frag_tile_to_rows``, the postprocess's code; each lane plays
    four of its 128 threads, in four passes of a quarter of the registers: 32 registers a thread)."""
    lane = cute.arch.lane_idx()
    state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, CONV_STAGES)
    for _t in cutlass.range(count, unroll=1):
        pipe_cv.consumer_wait(state)
        rb = slots[state.index]
        cute.arch.sync_warp()  # every lane has read the slot before lane 0 frees it
        old = Int32(0)
        if lane == 0:
            pipe_cv.consumer_release(state)
            old = cute.arch.atomic_add(mQc.iterator + rb, Int32(-1), sem="acq_rel", scope="gpu")
        old = cute.arch.shuffle_sync(old, 0)
        state.advance()
        if old == 1:
            cute.arch.fence_acq_rel_gpu()  # the other CTAs' reductions, acquired by lane 0
            for j in cutlass.range_constexpr(4):
                frag_tile_to_rows(mdQaccum, mdQ, rb, lane + 32 * j, sm_scale, mLSE2, Float32.inf, dtype, 4)
