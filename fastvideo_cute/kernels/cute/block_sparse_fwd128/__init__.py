"""VSA block-sparse attention forward, 128-token q and kv blocks (CuTe DSL kernels).

One kernel class, ``block_sparse_fwd128_sm120.BlockSparseFwd128Sm120`` (mma.sync + TMA: the
GB10's, sm_121a, kernel; the same source compiles for sm_120a and sm_90a, where it is verified),
in two modes (:class:`Mode`) sharing everything but how the K/V loads are issued:

  ``simple_split``  8 MMA warps (16 query rows each) and a TMA producer warp: 288 threads, one CTA
                    per SM on the GB10's 99 KB of shared memory (the sm_12x default);
  ``w4r3``          4 MMA warps (32 rows each), no producer warp: the loads of chunk ``c + 2`` are
                    issued by MMA warp ``c % 4`` (the K load after chunk ``c``'s softmax), and each
                    warp reads the walk 32 entries at a time, one per lane, taking each chunk's
                    entry by a shuffle: 128 threads x 255 registers, two CTAs per H200 SM (the
                    sm_90 default).

Both run a branch-free P V on chunks whose 64 keys are all valid, and the phased walk. The other
variants that were measured (and their results) are listed in docs/architecture.md. Shapes,
launch limits and targets: :mod:`.limits`. Importing this package does not import the CuTe DSL;
:func:`kernel` does.
"""

from __future__ import annotations

import enum

from .limits import CAPABILITIES

__all__ = ["Mode", "MODES", "TARGET_ARCHS", "registry_name", "kernel_class", "kernel"]


class Mode(str, enum.Enum):
    """How the one kernel issues its loads (see the module docstring)."""

    W4R3 = "w4r3"
    SIMPLE_SPLIT = "simple_split"


MODES = tuple(m.value for m in Mode)

#: the archs the kernel is compiled for (compile_check order: the GB10 first)
TARGET_ARCHS = ("sm_121a", "sm_120a", "sm_90a")
assert set(TARGET_ARCHS) == set(CAPABILITIES.values())


def registry_name(mode: str) -> str:
    """The compile registry's (and warm-up's) name of a mode's kernel."""
    return f"block_sparse_fwd128_sm120_{Mode(mode).value}"


def kernel_class():
    """The kernel class (imports the CuTe DSL)."""
    from .block_sparse_fwd128_sm120 import BlockSparseFwd128Sm120

    return BlockSparseFwd128Sm120


def kernel(mode: str):
    """The kernel configured in ``mode`` ("w4r3" or "simple_split"): a :class:`fastvideo_cute.jit.CuteKernel`."""
    return kernel_class()(mode)
