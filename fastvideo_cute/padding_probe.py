"""Learn in the forward, without stalling it, whether K's and V's padding rows are already zero, so
the backward can skip its padding-zeroed copy of K and V.

Why: a backward backend whose kernels read partial kv tiles whole (cuDNN, FA4:
``zeroes_kv_padding``) needs the padding rows to be zero and otherwise copies K and V with them
zeroed: a full read and write of both (on the H200, Wan-1.3B grid, 64-token tiles, ~115 us of a
~7 ms backward). Inputs laid out by a tiler (FastVideo's, :func:`fastvideo_cute.tiling.to_tiles`)
already hold zeros there; the contract still allows anything (NaN, Inf), so the library cannot
assume it.

How: in a training forward that will need it, :meth:`PaddingProbe.launch` runs one Triton kernel
that reads only the padding rows (``kernels/triton/padding_probe``: ~18 % of K and V on that grid)
into a device flag, copies the flag into pinned host memory on the stream and records an event.
The backward calls :meth:`PaddingProbe.padding_zero`: it waits on that event (by then long
complete in a training step: the forward's own kernels, the rest of the model and the loss ran
after it) and reads the flag. Zero -> the backend runs on K and V as they are (``kv_padding_zero``:
its kernels read the very values the copy would hold, so the gradients are the copy path's);
otherwise it copies as before. Either way the result is exact; only the copy's cost moves. K and
V are saved tensors of the call, so autograd refuses a backward after an in-place change to them
(the flag cannot go stale).

Not launched (the backward copies as before) when the stream is being captured into a CUDA
graph (the captured backward cannot depend on a value read on the host at capture time).
``torch.compile`` traces the custom ops, which do not carry the probe: there the backward copies
too.
"""

from __future__ import annotations

import collections
import os
from typing import Optional

import torch

__all__ = ["PaddingProbe", "probe_counts"]

#: ``"launched"`` / ``"zero"`` / ``"nonzero"``: how often probes ran and what their backwards read
#: (tests observe which path a backward took through it).
probe_counts: "collections.Counter[str]" = collections.Counter()


class PaddingProbe:
    """A forward's answer to "are K's and V's padding rows all zero?", read by its backward."""

    __slots__ = ("_host", "_event", "_answer")

    def __init__(self, host: torch.Tensor, event: "Optional[torch.cuda.Event]"):
        self._host, self._event, self._answer = host, event, None

    @classmethod
    def launch(cls, k: torch.Tensor, v: torch.Tensor, kv_block_sizes: torch.Tensor, block_size: int,
               bshd: bool) -> Optional["PaddingProbe"]:
        """Start the probe on the current stream (no host sync); None where it cannot run (the
        stream is capturing a CUDA graph; CPU tensors outside the Triton interpreter): the backward
        then copies as before. On CPU under ``TRITON_INTERPRET=1`` (the CPU tests) it runs at once."""
        if k.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        if not k.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            return None
        from .kernels.triton.padding_probe import padding_nonzero_triton

        flag = torch.zeros(1, dtype=torch.int32, device=k.device)
        padding_nonzero_triton(k, v, kv_block_sizes.to(torch.int32).contiguous(), block_size, flag, bshd=bshd)
        probe_counts["launched"] += 1
        if not k.is_cuda:  # CPU under the Triton interpreter (the tests): the flag is already there
            return cls(flag, None)
        host = torch.empty(1, dtype=torch.int32, pin_memory=True)
        host.copy_(flag, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(k.device))
        return cls(host, event)

    def padding_zero(self) -> bool:
        """True when every padding row of K and V held only zeros at the forward (asked once; later
        calls, e.g. a second backward through ``retain_graph``, reuse the answer)."""
        if self._answer is None:
            if self._event is not None:
                self._event.synchronize()
            self._answer = int(self._host[0]) == 0
        probe_counts["zero" if self._answer else "nonzero"] += 1
        return self._answer
