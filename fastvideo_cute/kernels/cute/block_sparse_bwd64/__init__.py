"""VSA block-sparse attention backward, 64-token q and kv blocks (CuTe DSL kernels).

Seed 000's launch chain, as CuTe DSL kernels JIT-compiled per arch:

  preprocess (``block_sparse_bwd64_common.BlockSparseBwd64Preprocess``): delta = rowsum(o * dO),
      lse in log2 with +inf for rows with no valid key, dq_accum zeroed, dk/dv rows of unselected
      kv blocks zeroed;
  work order (torch, in the adapter): identity below ``ORDER_MIN_KV_BLOCKS`` kv blocks per
      sequence, length-binned from the k2q counts from there;
  main (``block_sparse_bwd64_sm100``, sm_100a): tcgen05 + TMEM + TMA, dQ reduce-added in fp32;
  postprocess (``block_sparse_bwd64_common.BlockSparseBwd64Postprocess``): dq = bf16(dq_accum *
      sm_scale), rows with lse = -inf exactly 0.

``COMMON_ARCHS`` are the archs the arch-independent stages are built for (sm_90a: verified on the
H200; sm_100a/sm_103a: the stages of the Blackwell chain). ``MAIN_KERNEL_BY_ARCH`` maps an arch
family to the main kernel (sm_100a); ``MAIN_COMPILE_ARCHS`` are the archs CI compiles it for.

``REGISTRY_ENTRIES`` are :class:`fastvideo_cute.kernels.cute.CuteKernelSpec` entries for
``python -m fastvideo_cute.compile_check``; the registry module appends them. Importing this
package imports neither torch nor the CuTe DSL.
"""

from __future__ import annotations

import importlib

# Seed 000: below this many kv blocks per sequence the identity order; from it on, length bins.
ORDER_MIN_KV_BLOCKS = 1024

# Archs the arch-independent stages (preprocess, postprocess) are compiled for.
COMMON_ARCHS = ("sm_90a", "sm_100a", "sm_103a")

# stage -> (module, class)
STAGES = {
    "preprocess": ("block_sparse_bwd64_common", "BlockSparseBwd64Preprocess"),
    "postprocess": ("block_sparse_bwd64_common", "BlockSparseBwd64Postprocess"),
}

# arch family -> (module, class, arch string) of the tcgen05 main kernel. sm_100a only (seed 000:
# validated on GB200, not on B300); the source also compiles for sm_103a (MAIN_COMPILE_ARCHS).
MAIN_KERNEL_BY_ARCH = {
    100: ("block_sparse_bwd64_sm100", "BlockSparseBwd64Sm100", "sm_100a"),
}
MAIN_COMPILE_ARCHS = ("sm_100a", "sm_103a")


def stage_class(stage: str):
    """The kernel class of a stage ("preprocess", "postprocess")."""
    module, name = STAGES[stage]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def main_kernel_class(arch_family: int = 100):
    """The tcgen05 main kernel class for an arch family (100); KeyError if none is targeted."""
    module, name, _ = MAIN_KERNEL_BY_ARCH[arch_family]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def _build_main():
    kernel = main_kernel_class(100)()
    return kernel, kernel.fake_args()


def _build(stage: str):
    def build():
        kernel = stage_class(stage)()
        return kernel, kernel.fake_args()

    return build


def _registry_entries():
    from .. import CuteKernelSpec  # the registry module defines it before importing us

    return (
        CuteKernelSpec(
            name="block_sparse_bwd64_preprocess",
            archs=COMMON_ARCHS,
            build=_build("preprocess"),
            forbid=("HMMA", "HGMMA", "UTCHMMA"),
            notes="VSA backward, 64-token blocks: delta, lse2, dq_accum = 0, dk/dv = 0 on unselected kv blocks",
        ),
        CuteKernelSpec(
            name="block_sparse_bwd64_postprocess",
            archs=COMMON_ARCHS,
            build=_build("postprocess"),
            forbid=("HMMA", "HGMMA", "UTCHMMA"),
            notes="VSA backward, 64-token blocks: dq = bf16(dq_accum * sm_scale), no-key rows 0",
        ),
        CuteKernelSpec(
            name="block_sparse_bwd64_sm100",
            archs=MAIN_COMPILE_ARCHS,
            build=_build_main,
            expect=("UTCHMMA", "LDTM", "UTMALDG", "UBLKRED"),
            forbid=("HMMA", "HGMMA"),
            notes="VSA backward, 64-token blocks, main: tcgen05 (M=128 q pairs), TMEM accumulators, "
                  "TMA K/V/Q/dO, dq_accum by fp32 cp.reduce.async.bulk (compiles; not yet run on a GPU)",
        ),
    )


REGISTRY_ENTRIES = _registry_entries()
