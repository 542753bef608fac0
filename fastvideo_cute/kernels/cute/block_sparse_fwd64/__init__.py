"""VSA block-sparse attention forward with LSE, 64-token q and kv blocks (CuTe DSL kernels).

Only data-center Blackwell is targeted: sm_100 (B200/GB200) and sm_103 run the tcgen05 + TMA
kernel (``block_sparse_fwd64_sm100.BlockSparseFwd64Sm100``). UNVERIFIED ON HARDWARE: it compiles
on the CPU box (tests/kernels/cute/test_block_sparse_fwd64_compile.py checks its SASS);
tests/kernels/cute/test_block_sparse_fwd64_gpu.py runs on a compute-capability 10.x GPU only.
``softmax_probe.SoftmaxRowProbe`` drives the kernel's (shared, ``common/softmax.py``) softmax math
on any GPU. Shapes, launch limits and targets: :mod:`.limits`.

Importing this package does not import the CuTe DSL; :func:`kernel` does.
"""

from __future__ import annotations

from .limits import CAPABILITIES

__all__ = ["REGISTRY_NAME", "TARGET_ARCHS", "kernel_class", "kernel"]

#: the kernel's name in ``fastvideo_cute.kernels.cute.REGISTRY`` (compile_check, warm-up)
REGISTRY_NAME = "block_sparse_fwd64_sm100"

#: the archs the kernel is compiled for
TARGET_ARCHS = tuple(CAPABILITIES.values())


def kernel_class():
    """The sm_100 kernel class (imports the CuTe DSL)."""
    from .block_sparse_fwd64_sm100 import BlockSparseFwd64Sm100

    return BlockSparseFwd64Sm100


def kernel():
    """The sm_100 kernel object (a :class:`fastvideo_cute.jit.CuteKernel`)."""
    return kernel_class()()
