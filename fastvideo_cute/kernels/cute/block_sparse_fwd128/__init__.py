"""VSA block-sparse attention forward, 128-token q and kv blocks (CuTe DSL kernels).

``KERNEL_BY_ARCH`` maps an arch family (compute capability ``major * 10 + minor``) to the kernel
class that serves it. sm_90, sm_120 and sm_121 all run the mma.sync + TMA kernel: it is the GB10's
(sm_121a) kernel, and it compiles unchanged for sm_120a and sm_90a (on the H200 it is the
verification target, not the fast route: FA4's wgmma kernels are). sm_100 is not targeted
(mma.sync exists there, but tcgen05 kernels serve it).

Importing this package does not import the CuTe DSL; :func:`kernel_class` does.
"""

from __future__ import annotations

# arch family -> (module, class name, arch string the kernel is compiled for)
KERNEL_BY_ARCH = {
    90: ("block_sparse_fwd128_sm120", "BlockSparseFwd128Sm120", "sm_90a"),
    120: ("block_sparse_fwd128_sm120", "BlockSparseFwd128Sm120", "sm_120a"),
    121: ("block_sparse_fwd128_sm120", "BlockSparseFwd128Sm120", "sm_121a"),
}

TARGET_ARCHS = ("sm_90a", "sm_120a", "sm_121a")

# Kernel variants of the same contract: name -> (module, class, constructor kwargs).
#   simple       8 MMA warps (16 rows each) + a TMA producer warp: the first verified variant
#   w4           4 MMA warps (32 rows each) + a TMA producer warp
#   w4i          4 MMA warps, no producer warp (MMA warp 0 issues the loads): 128 threads
#                x 255 registers, so two CTAs fit an H200 SM
#   w4i_nophase  w4i without the phased walk (to measure what the walk buys in L2 hits)
#   w4i_split    w4i with a branch-free P V for chunks whose keys are all valid
#   w4r          w4i_split with the loads issued by the 4 warps in turn (not always warp 0), the
#                walk read two chunks ahead
#   w4r_nophase  w4r without the phased walk
#   w4r2         w4r with the walk read 32 entries at a time, one per lane, each chunk's by a shuffle
#   w4r3         w4r2 with the K load of chunk c + 2 issued after chunk c's softmax (the sm_90 default)
#   simple_split simple with the branch-free P V for full chunks (the sm_12x default)
#   ws           seed 004's two warp groups, QK and PV (8 warps of 16 rows each), overlapping
#                through shared memory
_SIMPLE = ("block_sparse_fwd128_sm120", "BlockSparseFwd128Sm120")
VARIANTS = {
    "simple": (*_SIMPLE, {}),
    "w4": (*_SIMPLE, {"num_mma_warps": 4}),
    "w4i": (*_SIMPLE, {"num_mma_warps": 4, "inline_producer": True}),
    "w4i_nophase": (*_SIMPLE, {"num_mma_warps": 4, "inline_producer": True, "phased": False}),
    "w4i_split": (*_SIMPLE, {"num_mma_warps": 4, "inline_producer": True, "split_full": True}),
    "w4r": (*_SIMPLE, {"num_mma_warps": 4, "inline_producer": True, "spread_producer": True, "split_full": True}),
    "w4r_nophase": (*_SIMPLE, {"num_mma_warps": 4, "inline_producer": True, "spread_producer": True,
                               "split_full": True, "phased": False}),
    "w4r2": (*_SIMPLE, {"num_mma_warps": 4, "inline_producer": True, "spread_producer": True, "split_full": True,
                        "lane_walk": True}),
    "w4r3": (*_SIMPLE, {"num_mma_warps": 4, "inline_producer": True, "spread_producer": True, "split_full": True,
                        "lane_walk": True, "late_k_issue": True}),
    "simple_split": (*_SIMPLE, {"split_full": True}),
    "ws": ("block_sparse_fwd128_sm120_ws", "BlockSparseFwd128Sm120WS", {}),
}


def registry_name(variant: str) -> str:
    """The compile registry's (and the warm-up cache's) name of a variant."""
    return "block_sparse_fwd128_sm120" + ("" if variant == "simple" else "_" + variant)


def kernel_class(arch_family: int):
    """The kernel class for an arch family (90, 120, 121); KeyError if none is targeted."""
    import importlib

    module, name, _ = KERNEL_BY_ARCH[arch_family]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def variant_class(variant: str):
    """The kernel class of a variant (see ``VARIANTS``)."""
    import importlib

    module, name, _ = VARIANTS[variant]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def variant_kernel(variant: str):
    """A kernel object of a variant, configured (see ``VARIANTS``)."""
    return variant_class(variant)(**VARIANTS[variant][2])


def target_arch(arch_family: int) -> str:
    """The ``--gpu-arch`` string for an arch family: "sm_121a" for 121, and so on."""
    return KERNEL_BY_ARCH[arch_family][2]
