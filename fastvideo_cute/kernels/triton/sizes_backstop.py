"""The device-side backstop of the sizes range check, in one Triton launch.

``fastvideo_cute.validation.check_sizes_range`` reads a CUDA sizes tensor on the host once and
remembers the pass; every later call re-checks it on the device, without a host sync, to catch
writes no host record can see (through ``.data``, or in place to an inference tensor). In torch
ops that check is five launches (``aminmax``, two compares, an ``and``, ``_assert_async``: about
8 us of GPU time per call on the H200, ``benchmarks/results/prof_route_h200_v1_synthetic.json``);
this kernel is one (1.0 vs 7.0 us, ``benchmarks/results/metadata_sweep_h200.json``).

Dataflow: one program of ``BLOCK`` lanes walks ``sizes[0:N]`` (int32, contiguous) in ``BLOCK``
chunks, keeps the running min and max, and fails ``tl.device_assert`` (compiled in: the kernel is
jitted with ``debug=True``) unless ``LO <= min`` and ``max <= HI``. A failed assert is a CUDA
device-side assert (a sticky CUDA error), as ``torch._assert_async`` raises; its message is the
constexpr ``MSG``. No host sync, no output; CUDA-graph capturable.

Limits: CUDA tensors (the Triton interpreter does not raise on ``device_assert``: the library
re-checks CPU tensors on the host on every call instead). This module does not import torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["sizes_backstop_launch"]

_BLOCK = 1024


@triton.jit(debug=True)
def _sizes_backstop_kernel(Sizes, N, LO, HI, MSG: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    lo = tl.full((BLOCK,), LO, tl.int32)
    hi = tl.full((BLOCK,), HI, tl.int32)
    bad = tl.zeros((BLOCK,), tl.int32)
    for start in range(0, N, BLOCK):
        x = tl.load(Sizes + start + offs, mask=start + offs < N, other=LO)
        bad |= ((x < lo) | (x > hi)).to(tl.int32)
    tl.device_assert(tl.max(bad, axis=0) == 0, MSG)


def sizes_backstop_launch(sizes, lo: int, hi: int, message: str) -> None:
    """Queue the check ``lo <= sizes <= hi`` (int32, contiguous, CUDA, on the current device)."""
    _sizes_backstop_kernel[(1,)](sizes, sizes.numel(), int(lo), int(hi), MSG=message, BLOCK=_BLOCK, num_warps=4)
