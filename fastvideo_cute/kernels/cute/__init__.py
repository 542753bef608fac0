"""Our CuTe DSL kernels, and the registry ``fastvideo_cute.compile_check`` compiles.

Each :class:`CuteKernelSpec` names one kernel variant, the archs it targets, the SASS
instructions its cubin must contain (and must not), and a ``build`` function returning
``(jit_callable, fake_args)`` for ``cute.compile(jit_callable, *fake_args, options=...)``: fake
tensors and a fake stream, so it compiles on a machine without a GPU. Importing this package
imports neither torch nor the CuTe DSL; ``build`` does the latter. (FA4's kernels are checked
elsewhere: tests/adapters/test_fa4_compile.py.)

To register a kernel (a tcgen05 one, say), append a spec to ``REGISTRY``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Tuple

__all__ = ["CuteKernelSpec", "REGISTRY", "SASS_COUNTED", "find"]

# The instructions compile_check counts and prints for every variant.
SASS_COUNTED = ("HMMA", "HGMMA", "UTCHMMA", "UTMALDG", "LDTM")


@dataclass(frozen=True)
class CuteKernelSpec:
    name: str
    archs: Tuple[str, ...]  # the archs it is built for ("sm_121a", ...); others are skipped
    build: Callable[[], tuple]  # () -> (jit callable, fake args)
    expect: Tuple[str, ...] = ()  # SASS opcode prefixes that must appear, e.g. "HMMA.16816"
    forbid: Tuple[str, ...] = ()  # SASS opcode prefixes that must not appear
    max_spill_bytes: int = 0  # the spill the tests accept (measured, per variant)
    notes: str = field(default="", compare=False)


def _block_sparse_fwd128(variant: str):
    def build():
        from .block_sparse_fwd128 import variant_kernel

        kernel = variant_kernel(variant)
        return kernel, kernel.fake_args()

    return build


def _block_sparse_fwd64_sm100(variant: str):
    def build():
        from .block_sparse_fwd64 import variant_kernel

        kernel = variant_kernel(variant)
        return kernel, kernel.fake_args()

    return build


# The mma.sync + TMA forward's variants (block_sparse_fwd128.VARIANTS), one spec each: same archs,
# same instruction checks.
_FWD128_NOTES = {
    "simple": "VSA forward, 128-token blocks: mma.sync + ldmatrix, TMA K/V rings, 8 MMA warps + a producer warp",
    "w4": "the same, 4 MMA warps of 32 rows (half the ldmatrix traffic per MMA) + a producer warp",
    "w4i": "4 MMA warps, no producer warp (MMA warp 0 issues the TMA loads): two CTAs per H200 SM",
    "w4i_nophase": "w4i without the phased walk (measures the walk's L2 effect)",
    "w4i_split": "w4i with a branch-free P V for full chunks",
    "w4r": "w4i_split with the TMA loads issued by the 4 warps in turn, the walk read two chunks ahead",
    "w4r_nophase": "w4r without the phased walk (measures the walk's L2 effect)",
    "w4r2": "w4r with the walk read 32 entries at a time, one per lane (a shuffle per chunk, no list reads)",
    "w4r3": "w4r2 with each K load issued after the softmax (its slot is then most likely free)",
    "simple_split": "simple with a branch-free P V for full chunks",
    "ws": "two warp groups, QK (S, softmax, P) and PV (8 + 8 warps), overlapping through shared memory",
}


# Spill accepted per variant: the 4-warp variants (32 rows per warp, 251-255 registers) spill
# 0 B with the CUDA 13 toolchain (nvidia-cutlass-dsl-libs-cu13, what the H200 runs used) on every
# arch, and on sm_120a/sm_121a with the CUDA 12 one (CI's default install) the bytes below, the
# same on both archs (measured 2026-11-30); sm_90a: 0 B with either.
_FWD128_SPILL = {"w4": 136, "w4i": 136, "w4i_nophase": 136, "w4i_split": 144, "w4r": 144, "w4r_nophase": 144,
                 "w4r2": 160, "w4r3": 112}


def _fwd128_spec(variant: str) -> CuteKernelSpec:
    from .block_sparse_fwd128 import registry_name

    return CuteKernelSpec(name=registry_name(variant), archs=("sm_121a", "sm_120a", "sm_90a"),
                          build=_block_sparse_fwd128(variant), expect=("HMMA.16816", "UTMALDG"),
                          forbid=("HGMMA", "UTCHMMA"), max_spill_bytes=_FWD128_SPILL.get(variant, 0),
                          notes=_FWD128_NOTES[variant])


REGISTRY: Tuple[CuteKernelSpec, ...] = (
    *(_fwd128_spec(v) for v in _FWD128_NOTES),
    CuteKernelSpec(
        name="block_sparse_fwd64_sm100",
        archs=("sm_100a", "sm_103a"),
        build=_block_sparse_fwd64_sm100("simple"),
        expect=("UTCHMMA", "LDTM", "UTMALDG"),
        forbid=("HMMA", "HGMMA"),
        notes="VSA forward + LSE, 64-token blocks: tcgen05 MMA (M=128, rows 64-127 discarded), S and "
              "O_j in TMEM, TMA K/V ring (UNVERIFIED on hardware)",
    ),
    CuteKernelSpec(
        name="block_sparse_fwd64_sm100_overlap",
        archs=("sm_100a", "sm_103a"),
        build=_block_sparse_fwd64_sm100("overlap"),
        expect=("UTCHMMA", "LDTM", "UTMALDG"),
        forbid=("HMMA", "HGMMA"),
        notes="the same, S double-buffered in TMEM and the next block's QK issued after this "
              "block's PV (experimental, UNVERIFIED on hardware)",
    ),
)


# The 64-token backward chain (preprocess/postprocess for sm_90a/sm_100a/sm_103a, the tcgen05 main
# kernel for sm_100a/sm_103a); its package imports CuteKernelSpec from here, so it comes last.
from .block_sparse_bwd64 import REGISTRY_ENTRIES as _BWD64_ENTRIES  # noqa: E402

REGISTRY = REGISTRY + tuple(_BWD64_ENTRIES)


def find(name: str) -> CuteKernelSpec:
    for spec in REGISTRY:
        if spec.name == name:
            return spec
    raise KeyError(f"no CuTe kernel named {name!r}; known: {[s.name for s in REGISTRY]}")
