"""VSA block-sparse attention forward with LSE, 64-token q and kv blocks (CuTe DSL kernels).

Hopper: ``block_sparse_fwd64_sm90.BlockSparseFwd64Sm90`` (wgmma + TMA, one warpgroup, three CTAs
per SM; sm_90a), verified on the H200 (tests/kernels/cute/test_block_sparse_fwd64_sm90_gpu.py) and
measured beside cuDNN BSA's blk64 forward (``benchmarks/explore_fwd64_sm90.py``: 1.06-1.10x
its rate with the lazy rescale and its vote, ``benchmarks/results/fwd64_sm90_h200_v11.json``,
docs/hopper-64-token.md). Routed (the ``sm90`` backend) for the
64-token forward and the 128/256-token partial-tile forwards by the route table, and for
``video_sparse_attn``'s gated inference calls with the gate composition fused in its epilogue
(``fuse_gate``).

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

__all__ = ["REGISTRY_NAME", "TARGET_ARCHS", "kernel_class", "kernel", "SM90_REGISTRY_NAME", "SM90_TARGET_ARCHS",
           "sm90_kernel_class", "sm90_kernel"]

#: the Hopper kernel's registry name and its one target
SM90_REGISTRY_NAME = "block_sparse_fwd64_sm90"
SM90_TARGET_ARCHS = ("sm_90a",)

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


def sm90_kernel_class():
    """The sm_90 kernel class (imports the CuTe DSL)."""
    from .block_sparse_fwd64_sm90 import BlockSparseFwd64Sm90

    return BlockSparseFwd64Sm90


def sm90_kernel(dtype: str = "bfloat16", head_dim: int = 128, has_block_sizes: bool = True, fuse_gate: bool = False,
                **pipeline):
    """The sm_90 kernel object for one static configuration (``fuse_gate``: the VSA gate
    composition in the epilogue, verified on the H200; ``pipeline``: ``k_stages``, ``v_stages``, ``ctas_per_sm``,
    ``stmatrix_epilogue``, the kernel's defaults when left out)."""
    return sm90_kernel_class()(dtype, head_dim, has_block_sizes=has_block_sizes, fuse_gate=fuse_gate, **pipeline)
