"""Head groups for ``video_sparse_attn``'s gated inference forward: the glue of one group of heads
runs on a second stream beside the block-sparse kernel of the group before it.

Only for a call on a route whose forward fuses the gate (``sm90``: see
:mod:`fastvideo_cute.vsa_autograd`), no grad, eager mode, CUDA, ``vsa_ops._GATED_HEAD_GROUPS > 1``
and at least two heads. For heads split into ``G`` contiguous groups ``[h0, h1)``:

```
main stream:  glue(g0) -> sparse(g0) ----------> [wait glue(g1)] sparse(g1) -> ... [wait glue(gG-1)] sparse(gG-1)
glue stream:            [wait glue(g0)] glue(g1) -> glue(g2) -> ...
```

glue = block means (``vsa_compress``) and coarse attention + top-k (``vsa_select``) of the group's
heads (head slices of q / k / v: strided views, no copies); sparse = the backend's
``forward_gated`` writing ``out_s + gate * out_c`` straight into the group's head slice of the
output (``out=``). Each head's computation is the unsplit call's, kernel by kernel on the same
inputs, so the output is bitwise the same; only the launch order changes. The glue stream forks
from the caller's stream at the first group's glue and the caller's stream waits for every later
group's glue before that group's sparse kernel, so everything the caller launches afterwards is
ordered after all of it (CUDA-graph capture included: fork and join on the capturing stream).
Tensors made on the glue stream and read on the caller's (out_c, the q2k lists) are recorded on
the caller's stream for the allocator (outside a capture).

Why it can pay: the sparse kernel fills each SM's CTA slots by registers (three 128-thread CTAs)
and leaves room beside them for the glue's one-warp programs (the block means, the top-k), and the
glue's larger programs fill the sparse kernel's last wave. What it costs: each group's kernel has
a partial last wave of its own, so only long kernels gain (``vsa_ops._GATED_GROUP_MIN_TILES``).
Measured by ``benchmarks/ab_vsa_glue.py`` (configurations ``groups2`` ...) on the H200
(``benchmarks/results/ab_vsa_glue_h200_groups_{13b,14b}.json``): Wan-14B 720p 2.7 % faster with two groups
(42.12 vs 43.30 ms; three groups or a high-priority glue stream within 0.3 % of that), Wan-1.3B
480p 3 % slower (2.387 vs 2.315 ms; four groups 50 % slower), so 1.3B is not split.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
from torch import Tensor

from . import vsa_ops
from .backends import BACKENDS
from .ops import _sparsity, dispatch_counts
from .routes import ROUTE_SEP

__all__ = ["head_groups", "pipelined_groups", "gated_forward_pipelined"]

_STREAMS: dict = {}


def head_groups(heads: int, groups: int) -> List[Tuple[int, int]]:
    """``min(groups, heads)`` contiguous ``[h0, h1)`` ranges covering ``range(heads)``, sizes
    differing by at most one (the larger first)."""
    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    g = max(1, min(int(groups), heads))
    base, extra = divmod(heads, g)
    out, h0 = [], 0
    for i in range(g):
        h1 = h0 + base + (1 if i < extra else 0)
        out.append((h0, h1))
        h0 = h1
    return out


def pipelined_groups(q: Tensor, bshd: bool, block: int) -> int:
    """How many head groups this call's gated inference forward runs in (1: not pipelined):
    ``vsa_ops._GATED_HEAD_GROUPS``, fewer where a group's sparse kernel would have fewer than
    ``vsa_ops._GATED_GROUP_MIN_TILES`` query tiles (``B * heads_per_group * Qb``)."""
    groups = int(vsa_ops._GATED_HEAD_GROUPS)
    b, heads, sq = (q.shape[0], q.shape[2], q.shape[1]) if bshd else q.shape[:3]
    if groups <= 1 or heads < 2 or not q.is_cuda or torch.compiler.is_compiling():
        return 1
    tiles = b * (-(-sq // block))
    while groups > 1 and tiles * (heads // groups) < int(vsa_ops._GATED_GROUP_MIN_TILES):
        groups -= 1
    return min(groups, heads)


def _glue_stream(device: torch.device) -> torch.cuda.Stream:
    """One glue stream per (device, priority); ``vsa_ops._GATED_GLUE_PRIORITY`` < 0 asks for a
    higher priority than the caller's default stream (its CTAs are dispatched first)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, int(vsa_ops._GATED_GLUE_PRIORITY))
    stream = _STREAMS.get(key)
    if stream is None:
        stream = _STREAMS[key] = torch.cuda.Stream(device, priority=key[1])
    return stream


def gated_forward_pipelined(q: Tensor, k: Tensor, v: Tensor, gate: Tensor, q_sizes: Tensor, kv_sizes: Tensor, *,
                            topk: int, block: int, bshd: bool, sm_scale: float, route: str,
                            groups: int) -> Tensor:
    """``out_s + gate * out_c`` of the whole call (module docstring), inputs validated and range
    checked by the caller, ``route``'s forward backend one that fuses the gate."""
    name = route.split(ROUTE_SEP)[0]
    backend = BACKENDS[name]
    if not getattr(backend, "fuses_gate", False):
        raise RuntimeError(f"gated_forward_pipelined: backend {name!r} does not fuse the gate")
    heads = q.shape[2] if bshd else q.shape[1]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    main = torch.cuda.current_stream(q.device)
    glue = _glue_stream(q.device)
    capturing = torch.cuda.is_current_stream_capturing()

    def heads_of(t: Tensor, h0: int, h1: int) -> Tensor:
        return t[:, :, h0:h1] if bshd else t[:, h0:h1]

    first_glue = None
    for i, (h0, h1) in enumerate(head_groups(heads, groups)):
        stream = main if i == 0 else glue
        if i == 1:
            glue.wait_event(first_glue)  # beside group 0's sparse kernel, not its glue
        qi, ki, vi, gi = (heads_of(t, h0, h1) for t in (q, k, v, gate))
        with torch.cuda.stream(stream):
            qc, kc, vc = vsa_ops._compress_impl(qi, ki, vi, q_sizes, kv_sizes, block, bshd, True)
            out_c, _, _, idx, num = vsa_ops._select_impl(qc, kc, vc, kv_sizes, topk, sm_scale, q.dtype, False)
            done = torch.cuda.Event()
            done.record(stream)
        if i == 0:
            first_glue = done
        else:
            main.wait_event(done)
            if not capturing:
                for t in (out_c, idx, num):
                    t.record_stream(main)
        dispatch_counts[(name, "fwd")] += 1
        backend.forward_gated(qi, ki, vi, _sparsity(None, idx, num, kv_sizes), kv_sizes, gi, out_c,
                              block_size=block, bshd=bshd, sm_scale=sm_scale, out=heads_of(out, h0, h1))
    return out
