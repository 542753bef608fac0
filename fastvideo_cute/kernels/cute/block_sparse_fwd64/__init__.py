"""VSA block-sparse attention forward with LSE, 64-token q and kv blocks (CuTe DSL kernels).

``KERNEL_BY_ARCH`` maps an arch family (compute capability ``major * 10 + minor``) to the kernel
class that serves it. Only data-center Blackwell is targeted: sm_100 (B200/GB200) runs the
tcgen05 + TMA kernel, compiled for sm_100a. UNVERIFIED ON HARDWARE: it compiles on the CPU box
(tests/kernels/cute/test_block_sparse_fwd64_compile.py checks its SASS for UTCHMMA and LDTM);
tests/kernels/cute/test_block_sparse_fwd64_gpu.py runs on a compute-capability 10.x GPU only.

Importing this package does not import the CuTe DSL; :func:`kernel_class` does.
"""

from __future__ import annotations

# arch family -> (module, class name, arch string the kernel is compiled for)
KERNEL_BY_ARCH = {
    100: ("block_sparse_fwd64_sm100", "BlockSparseFwd64Sm100", "sm_100a"),
}

TARGET_ARCHS = ("sm_100a", "sm_103a")

# Variants of one contract (constructor options of the class): "simple" (QK, softmax, PV and the
# O accumulate strictly in turn per kv block: the bring-up default) and "overlap" (S
# double-buffered in TMEM, the next block's QK issued right after this block's PV). Both
# compile; neither has run on hardware yet.
VARIANTS = {
    "simple": {"overlap": False},
    "overlap": {"overlap": True},
}


def variant_kernel(variant: str = "simple"):
    """An instance of the sm_100 kernel configured as ``variant`` ("simple", "overlap")."""
    return kernel_class(100)(**VARIANTS[variant])


def kernel_class(arch_family: int = 100):
    """The kernel class for an arch family (100); KeyError if none is targeted."""
    import importlib

    module, name, _ = KERNEL_BY_ARCH[arch_family]
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def target_arch(arch_family: int = 100) -> str:
    """The ``--gpu-arch`` string for an arch family: "sm_100a" for 100."""
    return KERNEL_BY_ARCH[arch_family][2]
