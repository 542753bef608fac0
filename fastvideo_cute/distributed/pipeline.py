"""The Ulysses attention pipeline: all-to-all in, attention per head chunk, all-to-all out; and
its backward, the transposed all-to-alls around the attention's own backward.

``run(plan, inputs)`` runs one sequence-parallel attention call for sequence-sharded ``inputs``
(q, k, v and optionally the gate, one dtype) on a group of ``plan.size > 1`` ranks:

forward, per head chunk ``c`` of this rank's ``H_l = H / P`` heads (one chunk by default):

1. pack q, k, v (, gate) of chunk ``c`` for every peer into one buffer, issue ONE fused
   ``all_to_all_single`` (async) -- all chunks are issued before the first is waited for, so
   chunk ``c+1`` moves while chunk ``c`` is computed;
2. wait, unpack: all ``S`` tokens for the chunk's heads;
3. ``plan.attend(tensors, lo, hi)``: the public single-GPU function (so every route serves it),
   under ``enable_grad`` on fresh leaf tensors when a gradient is needed (the graph is kept on
   the autograd context, as checkpointing does);
4. pack the output (and the LSE's bytes, when there is one), issue ONE all-to-all back (async),
   go on with the next chunk; the outputs are unpacked once all chunks are done.

backward (``_Ulysses.backward``), per chunk: ONE all-to-all of ``dout`` to the head sharding
(all chunks issued first), ``torch.autograd.grad`` through the kept graph, ONE fused all-to-all
of dq, dk, dv (, dgate) back to the sequence sharding (async, overlapping the next chunk).

Without a gradient to compute, ``run`` calls the pipeline directly (no autograd Function, no
graph kept). Limits: eager only (``run`` is wrapped in ``torch.compiler.disable``); no double backward; which of
q, k, v, gate require grad must be the same on every rank (it decides what the backward moves).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import exchange as ex

__all__ = ["Plan", "run", "chunk_bounds"]

Attend = Callable[[Sequence[Tensor], int, int], Tuple[Tensor, Optional[Tensor]]]


@dataclasses.dataclass(frozen=True)
class Plan:
    group: object
    size: int  # P > 1
    bshd: bool
    heads: int  # H, all heads (H_l = H / P per rank)
    chunks: Tuple[Tuple[int, int], ...]  # local head ranges [lo, hi) of H_l, in order
    attend: Attend  # (full q, k, v[, gate] of heads lo..hi) -> (out, lse or None)
    has_lse: bool


def chunk_bounds(heads_local: int, chunks: int) -> Tuple[Tuple[int, int], ...]:
    """``chunks`` near-equal contiguous ranges covering ``[0, heads_local)``."""
    cuts = [heads_local * c // chunks for c in range(chunks + 1)]
    return tuple((cuts[c], cuts[c + 1]) for c in range(chunks))


def _full_shape(local: Tensor, heads: int, size: int, bshd: bool) -> Tuple[int, ...]:
    b, d = local.shape[0], local.shape[3]
    s = local.shape[1 if bshd else 2] * size
    return (b, s, heads, d) if bshd else (b, heads, s, d)


def _lse_bytes(lse: Tensor, dtype: torch.dtype) -> Tensor:
    """fp32 ``[B, H, S]`` -> a ``[B, H, S, e]`` BHSD tensor of ``dtype`` over the same bytes."""
    return lse.unsqueeze(-1).view(dtype)


def _issue_inputs(plan: Plan, tensors: Sequence[Tensor]) -> List[ex.Pending]:
    p, bshd = plan.size, plan.bshd
    views = [ex.heads_view(x, p, bshd) for x in tensors]
    return [ex.start([ex.head_slice(v, lo, hi, bshd) for v in views], plan.group) for lo, hi in plan.chunks]


def _receive_full(plan: Plan, pending: ex.Pending, like: Sequence[Tensor], lo: int, hi: int) -> List[Tensor]:
    fulls = [torch.empty(_full_shape(x, hi - lo, plan.size, plan.bshd), dtype=x.dtype, device=x.device)
             for x in like]
    ex.finish(pending, [ex.seq_view(f, plan.size, plan.bshd) for f in fulls])
    return fulls


def _forward(plan: Plan, inputs: Sequence[Tensor], requires: Optional[Sequence[bool]]):
    """The forward pipeline; ``requires`` (per input: needs a gradient) is None without autograd.
    Returns ``out, lse, kept`` where ``kept[c] = (leaves, out_full)`` of chunk c (grad only)."""
    p, bshd, q = plan.size, plan.bshd, inputs[0]
    pend_in = _issue_inputs(plan, inputs)
    pend_out, kept = [], []
    for (lo, hi), pending in zip(plan.chunks, pend_in):
        fulls = _receive_full(plan, pending, inputs, lo, hi)
        if requires is not None:
            fulls = [f.requires_grad_(r) for f, r in zip(fulls, requires)]
            with torch.enable_grad():
                out_full, lse = plan.attend(fulls, lo, hi)
            kept.append((fulls, out_full))
        else:
            out_full, lse = plan.attend(fulls, lo, hi)
        sources = [ex.seq_view(out_full.detach(), p, bshd)]
        if plan.has_lse:
            sources.append(ex.seq_view(_lse_bytes(lse, q.dtype), p, False))
        pend_out.append(ex.start(sources, plan.group))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    b, s_l = q.shape[0], q.shape[1 if bshd else 2]
    lse_local = torch.empty((b, plan.heads, s_l), dtype=torch.float32, device=q.device) if plan.has_lse else None
    out_chunks = ex.heads_view(out, p, bshd)
    lse_chunks = ex.heads_view(_lse_bytes(lse_local, q.dtype), p, False) if plan.has_lse else None
    for (lo, hi), pending in zip(plan.chunks, pend_out):
        dests = [ex.head_slice(out_chunks, lo, hi, bshd)]
        if plan.has_lse:
            dests.append(ex.head_slice(lse_chunks, lo, hi, False))
        ex.finish(pending, dests)
    return out, lse_local, kept


class _Ulysses(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: Plan, *inputs: Tensor):
        requires = tuple(ctx.needs_input_grad[1:])
        out, lse, kept = _forward(plan, inputs, requires)
        ctx.plan, ctx.kept, ctx.requires = plan, kept, requires
        ctx.metas = [(x.shape, x.dtype, x.device) for x in inputs]
        if lse is None:
            return out
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout: Tensor, *unused: Tensor):
        plan, kept, requires = ctx.plan, ctx.kept, ctx.requires
        if kept is None:
            raise RuntimeError("ulysses attention: backward called twice (retain_graph is not supported)")
        ctx.kept = None
        p, bshd = plan.size, plan.bshd
        wanted = [i for i, r in enumerate(requires) if r]
        grads = [torch.empty(ctx.metas[i][0], dtype=ctx.metas[i][1], device=ctx.metas[i][2]) for i in wanted]
        grad_chunks = [ex.heads_view(g, p, bshd) for g in grads]
        pend_dout = _issue_inputs(plan, [dout])
        pend_grad = []
        for c, ((lo, hi), pending) in enumerate(zip(plan.chunks, pend_dout)):
            leaves, out_full = kept[c]
            dfull = _receive_full(plan, pending, [dout], lo, hi)[0]
            got = torch.autograd.grad(out_full, [leaves[i] for i in wanted], dfull, allow_unused=True)
            got = [g if g is not None else torch.zeros_like(leaves[i]) for g, i in zip(got, wanted)]
            kept[c] = None  # free this chunk's graph
            pend_grad.append(ex.start([ex.seq_view(g, p, bshd) for g in got], plan.group))
        for (lo, hi), pending in zip(plan.chunks, pend_grad):
            ex.finish(pending, [ex.head_slice(gc, lo, hi, bshd) for gc in grad_chunks])
        result: List[Optional[Tensor]] = [None] * len(requires)
        for i, g in zip(wanted, grads):
            result[i] = g
        return (None, *result)


def _run(plan: Plan, inputs: Sequence[Tensor]):
    if torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        return _Ulysses.apply(plan, *inputs)
    out, lse, _ = _forward(plan, inputs, None)
    return (out, lse) if plan.has_lse else out


_RUN_EAGER: list = []


def run(plan: Plan, inputs: Sequence[Tensor]):
    """``out`` (or ``(out, lse)`` when ``plan.has_lse``), sequence-sharded like ``inputs[0]``.
    Excluded from ``torch.compile`` tracing (a graph break: collectives, a nested autograd graph);
    the ``torch.compiler.disable`` wrapper is made on first use, so importing this module does
    not import torch._dynamo."""
    if not _RUN_EAGER:
        _RUN_EAGER.append(torch.compiler.disable(_run))
    return _RUN_EAGER[0](plan, inputs)
