"""The 64-token tcgen05 forward's shapes and launch limits, declared once (no CuTe DSL, no torch):
the kernel (``block_sparse_fwd64_sm100``) is written against them and the adapter's support
predicate (``fastvideo_cute.adapters.cute_sm100_fwd``) checks them before any launch."""

from __future__ import annotations

from ..limits import GRID_Y_MAX, INT32_MAX, LaunchLimits

BLOCK = 64  # tokens per q / kv block
HEAD_DIM = 128
MMA_M = 128  # tcgen05 cta_group::1 tile rows; rows 64-127 are computed and discarded
KV_STAGES = 2  # K/V ring depth (the ring's phase arithmetic assumes two)

LIMITS = LaunchLimits(
    max_batch_heads=GRID_Y_MAX,  # grid (T, B*H)
    max_rows=INT32_MAX - MMA_M,  # B*H*S (+ the 64 discarded rows of the last Q tile): int32 rows
    max_index_elems=INT32_MAX,  # B*H*T*max_kv: q2k_idx is addressed with int32 offsets
)

#: compute capability -> the arch the kernel is compiled for
CAPABILITIES = {(10, 0): "sm_100a", (10, 3): "sm_103a"}
