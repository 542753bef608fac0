"""VSA block-sparse attention backward, 64-token q and kv blocks (CuTe DSL kernels).

Seed 000's launch chain, as CuTe DSL kernels JIT-compiled per arch:

  preprocess (``block_sparse_bwd64_common.BlockSparseBwd64Preprocess``): delta = rowsum(o * dO),
      lse in log2 with +inf for rows with no valid key, dq_accum zeroed, dk/dv rows of unselected
      kv blocks zeroed;
  work order (torch, in the adapter): identity below ``limits.ORDER_MIN_KV_BLOCKS`` kv blocks per
      sequence, length-binned from the k2q counts from there;
  main (``block_sparse_bwd64_sm100.BlockSparseBwd64Sm100``, sm_100a): tcgen05 + TMEM + TMA, dQ
      reduce-added in fp32; on Hopper ``block_sparse_bwd64_sm90.BlockSparseBwd64Sm90`` (sm_90a): wgmma
      + TMA, one warpgroup, dQ staged and bulk-reduced in fp32 (or by atomics);
  postprocess (``block_sparse_bwd64_common.BlockSparseBwd64Postprocess``): dq = bf16(dq_accum *
      sm_scale), rows with lse = -inf exactly 0.

``COMMON_ARCHS`` are the archs the arch-independent stages are built for (sm_90a: verified on the
H200; sm_100a/sm_103a: the stages of the Blackwell chain); the main kernel is built for
``limits.MAIN_COMPILE_ARCHS`` and run on ``limits.MAIN_CAPABILITIES``. Importing this package
imports neither torch nor the CuTe DSL; :func:`stage_kernel` and :func:`main_kernel` do the latter.
"""

from __future__ import annotations

from .limits import COMMON_CAPABILITIES, MAIN_CAPABILITIES, MAIN_COMPILE_ARCHS  # noqa: F401 (re-exported)

__all__ = ["COMMON_ARCHS", "MAIN_COMPILE_ARCHS", "STAGES", "stage_class", "stage_kernel", "main_kernel_class",
           "main_kernel", "SM90_REGISTRY_NAME", "sm90_main_kernel", "SM90_WS_REGISTRY_NAME", "sm90_ws_main_kernel",
           "SM90_DQ_REGISTRY_NAME", "sm90_dq_from_ds_kernel"]

#: the Hopper main kernel's registry name (targets sm_90a only)
SM90_REGISTRY_NAME = "block_sparse_bwd64_sm90"
#: the warp-specialized Hopper main kernel's registry name (sm_90a only)
SM90_WS_REGISTRY_NAME = "block_sparse_bwd64_sm90_ws"
#: the split backward's q-owned dQ kernel (sm_90a only)
SM90_DQ_REGISTRY_NAME = "block_sparse_dq64_sm90"

# Archs the arch-independent stages (preprocess, postprocess) are compiled for.
COMMON_ARCHS = tuple(COMMON_CAPABILITIES.values())

STAGES = ("preprocess", "preprocess_nodq", "postprocess", "postprocess_frag")


def stage_class(stage: str):
    """The kernel class of a stage ("preprocess", "preprocess_nodq", "postprocess", "postprocess_frag": the
    postprocess of the Hopper warp-specialized kernel's ``flat_dq`` dq_accum order)."""
    from . import block_sparse_bwd64_common as mod

    return {"preprocess": mod.BlockSparseBwd64Preprocess, "preprocess_nodq": mod.BlockSparseBwd64Preprocess,
            "postprocess": mod.BlockSparseBwd64Postprocess,
            "postprocess_frag": mod.BlockSparseBwd64PostprocessFrag}[stage]


def stage_kernel(stage: str):
    """The kernel object of a stage (a :class:`fastvideo_cute.jit.CuteKernel`); ``preprocess_nodq`` is the
    preprocess that leaves dq_accum alone (the split backward's)."""
    if stage == "preprocess_nodq":
        return stage_class(stage)(zero_dq=False)
    return stage_class(stage)()


def main_kernel_class():
    """The tcgen05 main kernel class (sm_100a)."""
    from .block_sparse_bwd64_sm100 import BlockSparseBwd64Sm100

    return BlockSparseBwd64Sm100


def main_kernel():
    """The tcgen05 main kernel object."""
    return main_kernel_class()()


def sm90_main_kernel(dq_reduce: str = "bulk", stats_in_smem: bool = False):
    """The wgmma main kernel object (sm_90a; imports the CuTe DSL); ``dq_reduce``: "atomic", "bulk"
    or "flat" (``block_sparse_bwd64_sm90.DQ_REDUCE``); ``stats_in_smem``: lse2/delta by bulk copy
    (always with "flat")."""
    from .block_sparse_bwd64_sm90 import BlockSparseBwd64Sm90

    return BlockSparseBwd64Sm90(dq_reduce, stats_in_smem)


def sm90_ws_main_kernel(**config):
    """The warp-specialized wgmma main kernel object (sm_90a; imports the CuTe DSL):
    ``block_sparse_bwd64_sm90_ws.BlockSparseBwd64Sm90Ws(**config)``."""
    from .block_sparse_bwd64_sm90_ws import BlockSparseBwd64Sm90Ws

    return BlockSparseBwd64Sm90Ws(**config)


def sm90_dq_from_ds_kernel(**config):
    """The q-owned dQ kernel of the split backward (sm_90a; imports the CuTe DSL):
    ``dq_from_ds_sm90.BlockSparseDq64Sm90(**config)``."""
    from .dq_from_ds_sm90 import BlockSparseDq64Sm90

    return BlockSparseDq64Sm90(**config)
