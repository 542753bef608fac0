"""Our CuTe DSL kernels, and the registry ``fastvideo_cute.compile_check`` (and the warm-up's
``--cute-kernels``) compile.

Each :class:`CuteKernelSpec` names one kernel configuration: ``make()`` returns the kernel object
(a :class:`fastvideo_cute.jit.CuteKernel`, compiled through :func:`fastvideo_cute.jit.compile_kernel`
from fake tensors, so it builds on a machine without a GPU), the archs it targets, the SASS
instructions its cubin must contain (and must not) and the spill the tests accept. Importing this
package imports neither torch nor the CuTe DSL; ``make()`` does the latter. (FA4's kernels are
checked elsewhere: tests/adapters/test_fa4_compile.py.)

The kernels share their common device code in ``common/`` and declare their shapes and launch
limits, CuTe-free, in ``<op>/limits.py``. To register a kernel, append a spec to ``REGISTRY``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Tuple

from . import block_sparse_bwd64 as _bwd64
from . import block_sparse_fwd64 as _fwd64
from . import block_sparse_fwd128 as _fwd128

__all__ = ["CuteKernelSpec", "REGISTRY", "SASS_COUNTED", "find"]

# The instructions compile_check counts and prints for every kernel.
SASS_COUNTED = ("HMMA", "HGMMA", "UTCHMMA", "UTMALDG", "LDTM")


@dataclass(frozen=True)
class CuteKernelSpec:
    name: str
    archs: Tuple[str, ...]  # the archs it is built for ("sm_121a", ...); others are skipped
    make: Callable[[], object]  # () -> the configured kernel object (a jit.CuteKernel)
    expect: Tuple[str, ...] = ()  # SASS opcode prefixes that must appear, e.g. "HMMA.16816"
    forbid: Tuple[str, ...] = ()  # SASS opcode prefixes that must not appear
    max_spill_bytes: int = 0  # the spill the tests accept (measured, per kernel)
    notes: str = field(default="", compare=False)


_FWD128_NOTES = {
    "w4r3": "VSA forward, 128-token blocks: mma.sync + TMA, 4 MMA warps that issue the loads in turn "
            "(K after the softmax), the walk read by lanes (the sm_90 default)",
    "simple_split": "VSA forward, 128-token blocks: mma.sync + TMA, 8 MMA warps + a TMA producer warp "
                    "(the sm_12x default)",
}

# Spill accepted per mode: w4r3 (32 rows per warp, 255 registers) spills 0 B with the CUDA 13
# toolchain (nvidia-cutlass-dsl-libs-cu13, what the H200 runs used) on every arch, and 112 B on
# sm_120a/sm_121a with the CUDA 12 one (CI's default install; measured 2026-11-30); sm_90a: 0 B
# with either. simple_split: 0 B everywhere.
_FWD128_SPILL = {"w4r3": 112}

_FWD128 = tuple(
    CuteKernelSpec(name=_fwd128.registry_name(mode), archs=_fwd128.TARGET_ARCHS, make=partial(_fwd128.kernel, mode),
                   expect=("HMMA.16816", "UTMALDG"), forbid=("HGMMA", "UTCHMMA"),
                   max_spill_bytes=_FWD128_SPILL.get(mode, 0), notes=_FWD128_NOTES[mode])
    for mode in _fwd128.MODES
)

_FWD64 = CuteKernelSpec(
    name=_fwd64.REGISTRY_NAME,
    archs=_fwd64.TARGET_ARCHS,
    make=_fwd64.kernel,
    expect=("UTCHMMA", "LDTM", "UTMALDG"),
    forbid=("HMMA", "HGMMA"),
    notes="VSA forward + LSE, 64-token blocks: tcgen05 MMA (M=128, rows 64-127 discarded), S and "
          "O_j in TMEM, TMA K/V ring (UNVERIFIED on hardware)",
)

_FWD64_SM90 = CuteKernelSpec(
    name=_fwd64.SM90_REGISTRY_NAME,
    archs=_fwd64.SM90_TARGET_ARCHS,
    make=_fwd64.sm90_kernel,
    expect=("HGMMA", "UTMALDG"),
    forbid=("HMMA", "UTCHMMA"),
    notes="VSA forward + LSE, 64-token blocks: wgmma (S from shared memory, P V with P in registers), "
          "one warpgroup, 3 CTAs/SM, TMA Q/K/V(2 slots)/O, V padding zeroed in the kernel (verified on "
          "the H200; the sm90 backend, routed for gated video_sparse_attn inference with fuse_gate)",
)

# The 64-token backward chain: preprocess/postprocess for sm_90a/sm_100a/sm_103a, the tcgen05 main
# kernel for sm_100a/sm_103a.
_BWD64_STAGE_NOTES = {
    "preprocess": "VSA backward, 64-token blocks: delta, lse2, dq_accum = 0, dk/dv = 0 on unselected kv blocks",
    "preprocess_nodq": "VSA backward, 64-token blocks: the preprocess without dq_accum = 0 (the Hopper split "
                       "backward's, which sums dQ from dS tiles)",
    "postprocess": "VSA backward, 64-token blocks: dq = bf16(dq_accum * sm_scale), no-key rows 0",
    "postprocess_frag": "VSA backward, 64-token blocks: the postprocess of register-ordered dq_accum tiles "
                        "(the sm_90a warp-specialized main kernel's flat_dq)",
}
_BWD64 = (
    *(CuteKernelSpec(name=f"block_sparse_bwd64_{stage}", archs=_bwd64.COMMON_ARCHS,
                     make=partial(_bwd64.stage_kernel, stage), forbid=("HMMA", "HGMMA", "UTCHMMA"),
                     notes=_BWD64_STAGE_NOTES[stage])
      for stage in _bwd64.STAGES),
    CuteKernelSpec(
        name="block_sparse_bwd64_sm100",
        archs=_bwd64.MAIN_COMPILE_ARCHS,
        make=_bwd64.main_kernel,
        expect=("UTCHMMA", "LDTM", "UTMALDG", "UBLKRED"),
        forbid=("HMMA", "HGMMA"),
        notes="VSA backward, 64-token blocks, main: tcgen05 (M=128 q pairs), TMEM accumulators, "
              "TMA K/V/Q/dO, dq_accum by fp32 cp.reduce.async.bulk (compiles; not yet run on a GPU)",
    ),
    CuteKernelSpec(
        name=_bwd64.SM90_REGISTRY_NAME,
        archs=("sm_90a",),
        make=_bwd64.sm90_main_kernel,
        expect=("HGMMA", "UTMALDG", "UBLKRED"),
        forbid=("HMMA.16816", "UTCHMMA", "REDG"),
        notes="VSA backward, 64-token blocks, main on Hopper: wgmma (S^T/dP^T SS, dV/dK RS, dQ SS in two "
              "halves), one warpgroup, two CTAs per SM, Q/dO double-buffered by TMA, dq_accum by "
              "cp.reduce.async.bulk of the tile staged in the step's Q/dO slots (verified on the H200)",
    ),
    CuteKernelSpec(
        name=_bwd64.SM90_REGISTRY_NAME + "_atomic",
        archs=("sm_90a",),
        make=partial(_bwd64.sm90_main_kernel, "atomic"),
        expect=("HGMMA", "UTMALDG", "REDG"),
        forbid=("HMMA.16816", "UTCHMMA"),
        notes="the Hopper backward main with dq_accum by per-element fp32 atomics (0.6x the bulk path)",
    ),
    CuteKernelSpec(
        name=_bwd64.SM90_WS_REGISTRY_NAME,
        archs=("sm_90a",),
        make=_bwd64.sm90_ws_main_kernel,
        expect=("HGMMA", "UTMALDG", "UTMAREDG", "UBLKCP", "USETMAXREG", "STSM", "LDSM"),
        forbid=("HMMA.16816", "UTCHMMA", "REDG"),
        notes="the Hopper backward main, warp-specialized: a producer warp, a dQ store warp, WG1 S/P/dV "
              "(K in registers), WG2 dP/dS/dQ/dK (V in registers), one CTA per SM, setmaxnreg, dq_accum by "
              "TMA reduce-add (1.02x / 0.99x / 0.89x cuDNN at 32K / Wan grid / 64K, verified on the H200)",
    ),
    CuteKernelSpec(
        name=_bwd64.SM90_WS_REGISTRY_NAME + "_grouped",
        archs=("sm_90a",),
        make=partial(_bwd64.sm90_ws_main_kernel, grouped=True),
        expect=("HGMMA", "UTMALDG", "UTMAREDG", "USETMAXREG", "UBLKRED"),
        forbid=("HMMA.16816", "UTCHMMA", "REDG"),
        notes="the warp-specialized backward main with a kv block's list split by q group over CTAs: "
              "dK/dV added into fp32 accumulators by one bulk reduce-add per warpgroup (the chain's "
              "choice from 768 q blocks on; verified on the H200)",
    ),
    CuteKernelSpec(
        name=_bwd64.SM90_WS_REGISTRY_NAME + "_ds_out",
        archs=("sm_90a",),
        make=partial(_bwd64.sm90_ws_main_kernel, flat_dq=True, ds_out=True, ds_evict_first=True),
        expect=("HGMMA", "UTMALDG", "UBLKCP", "USETMAXREG", "STSM"),
        forbid=("HMMA.16816", "UTCHMMA", "REDG", "UTMAREDG", "UBLKRED"),
        notes="the warp-specialized backward main of the split chain: each pair's bf16 dS tile bulk-stored "
              "to a workspace slot in q-owned order (L2 policy evict_first, as routed) instead of dQ = dS K "
              "and its fp32 reduce-add",
    ),
    CuteKernelSpec(
        name=_bwd64.SM90_DQ_REGISTRY_NAME,
        archs=("sm_90a",),
        make=partial(_bwd64.sm90_dq_from_ds_kernel, ds_evict_first=True),
        expect=("HGMMA", "UTMALDG", "UBLKCP"),
        forbid=("HMMA.16816", "UTCHMMA", "REDG", "UTMAREDG", "UBLKRED"),
        notes="the split chain's q-owned dQ kernel: dq = scale * sum_j dS_ij K_j in registers from the dS "
              "tiles (bulk copy, evict_first, as routed) and K (TMA), one fixed order, bf16 rows written once",
    ),
)

REGISTRY: Tuple[CuteKernelSpec, ...] = (*_FWD128, _FWD64, _FWD64_SM90, *_BWD64)


def find(name: str) -> CuteKernelSpec:
    for spec in REGISTRY:
        if spec.name == name:
            return spec
    raise KeyError(f"no CuTe kernel named {name!r}; known: {[s.name for s in REGISTRY]}")
