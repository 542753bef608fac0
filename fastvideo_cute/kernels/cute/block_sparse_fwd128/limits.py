"""The 128-token forward's shapes and launch limits, declared once (no CuTe DSL, no torch): the
kernel (``block_sparse_fwd128_sm120``) is written against them and the adapter's support
predicate (``fastvideo_cute.adapters.cute_sm120``) checks them before any launch."""

from __future__ import annotations

from ..limits import GRID_Y_MAX, INT32_MAX, LaunchLimits

BLOCK = 128  # tokens per q / kv tile
HEAD_DIM = 128
CHUNK = 64  # keys per K/V ring slot: every tile is two chunks
KV_STAGES = 2  # ring depth (the w4r3 mode reads the walk exactly two chunks ahead)
SMEM_CAPACITY = 99 * 1024  # GB10 / sm_120 opt-in shared memory per block

LIMITS = LaunchLimits(
    max_batch_heads=GRID_Y_MAX,  # grid (tiles, B*H)
    max_rows=INT32_MAX,  # B*H*S: TMA row coordinates are int32
    max_index_elems=INT32_MAX,  # B*H*T*max_kv: q2k_idx is addressed with int32 offsets
)

#: compute capability -> the arch the kernel is compiled for
CAPABILITIES = {(9, 0): "sm_90a", (12, 0): "sm_120a", (12, 1): "sm_121a"}
