"""The 64-token backward chain's shapes and launch limits, declared once (no CuTe DSL, no torch):
the kernels (``block_sparse_bwd64_common``, ``block_sparse_bwd64_sm100``) are written against them
and the adapter's support predicates (``fastvideo_cute.adapters.cute_sm100_bwd``) check them."""

from __future__ import annotations

from ..limits import INT32_MAX

BLOCK = 64  # tokens per q / kv block
HEAD_DIM = 128
#: int32 counters per kv block item of the warp-specialized Hopper kernel's ``ticket_dkv`` (``last_arrival``):
#: [2 tensors (dK, dV), 4 warps, (ticket, done)]
TICKET_COUNTERS = 2 * 4 * 2
#: fp32 elements per kv block item of ``ticket_dkv``'s workspace (its partial dK and dV tiles, 64 x 128 each)
TICKET_WS_FLOATS = 2 * BLOCK * HEAD_DIM

# Grid x of the common stages is B*H*S/64 and row indices are int32; the k2q list is addressed
# with int32 offsets.
MAX_ROWS = INT32_MAX

# Seed 000: below this many kv blocks per sequence the work order is the identity; from it on,
# length bins (the adapter computes the order).
ORDER_MIN_KV_BLOCKS = 1024

#: compute capability -> arch of the arch-independent stages (preprocess, postprocess)
COMMON_CAPABILITIES = {(9, 0): "sm_90a", (10, 0): "sm_100a", (10, 3): "sm_103a"}
#: compute capability -> arch of the whole chain (seed 000: validated on GB200 only, sm_100a)
MAIN_CAPABILITIES = {(10, 0): "sm_100a"}
#: archs CI compiles the tcgen05 main kernel for (its source also builds for sm_103a)
MAIN_COMPILE_ARCHS = ("sm_100a", "sm_103a")
#: compute capability -> arch of the Hopper main kernel (block_sparse_bwd64_sm90, wgmma)
SM90_CAPABILITIES = {(9, 0): "sm_90a"}
