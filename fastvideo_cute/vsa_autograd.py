"""``video_sparse_attn``'s autograd as one function over the VSA ops, so its backward fuses what
per-op autograd cannot.

Forward (the ops of :mod:`fastvideo_cute.vsa_ops` and :mod:`fastvideo_cute.ops`, called with
grad recording off): compression (``vsa_compress``; for a route whose backend reads partial kv
tiles whole, cuDNN and FA4, the same pass also writes V, and K when a backward follows, with their
padding rows zeroed, so the backend makes no sanitized copy of its own and the backward reads
those copies instead of k / v) -> coarse attention + top-k
(``vsa_select``) -> q2k lists, handed to the block-sparse forward on the chosen route as they are
(no bool map unless that route's kernels take one) ->
``out = out_s + gate * out_c`` (``vsa_gate``). An inference call with a gate on a route whose
forward backend fuses the gate into its epilogue (``fuses_gate``: ``sm90``, chosen by
``routes.select_vsa_routes``) runs ``block_sparse_attn_fwd_gated`` instead of the forward and
the gate pass (that backend masks K/V padding itself, so no padding-zeroed copy is made either);
a training call with a gate whose forward runs there (the route table pairs ``sm90``'s forward with
cuDNN's backward) runs ``block_sparse_attn_fwd_gated_train``: the same epilogue, which also stores
``out_s`` for the backward, so training skips the gate pass too (the backward is unchanged: the same
``out_s`` and LSE bits; ``out`` is rounded once from fp32 instead of from the rounded ``out_s``).

Backward, in this order:

1. ``vsa_gate_bwd``: ``d_gate`` and ``d_out_c`` (``d out_s`` is ``dout`` itself);
2. the route's block-sparse backward: fresh ``dq``/``dk``/``dv`` of the sparse branch;
3. ``vsa_select_bwd``: the coarse attention's ``dqc``/``dkc``/``dvc`` (``[B, H, n, D]`` fp32);
4. ``vsa_compress_bwd_accumulate``: ``dx[token] += dxc[block] / size`` straight into step 2's
   tensors, in place (one launch, valid tokens only).

With per-op autograd, step 4 wrote three fresh full-size tensors and autograd added each to the
sparse gradient (three more full-size launches: ~0.35 ms of a 12 ms Wan-1.3B forward+backward on
the H200, ``benchmarks/results/vsa_e2e_h200_tf32x3.json``); here the sum costs one read-modify-write.
The summation order is fixed (sparse first, then the compression term), so the result is as
deterministic as the route's backward.

Traceable by ``torch.compile`` (Dynamo traces ``autograd.Function`` through the custom ops' fake
implementations; the in-place accumulation is a custom op that declares what it mutates). In eager
mode the function calls the ops' implementations directly (``*_impl``, the same code the ops run):
a custom-op call costs ~35 us of Python dispatch, eight per training step, on a forward that was
host-bound on the H200 (``benchmarks/results/vsa_e2e_h200_v2.json``: 2.97 ms wall, 2.23 ms GPU).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import ops, vsa_ops, vsa_pipeline
from .backends import BACKENDS
from .routes import ROUTE_SEP
from .validation import check_sizes_range, has_partial_blocks

__all__ = ["video_sparse_attn_fn"]


def _dedupe(tensors):
    """Dynamo cannot trace ``autograd.Function.apply`` with one tensor passed twice (``q is k``,
    ``q_sizes is kv_sizes``): pass each tensor once and where it goes as ``slots``."""
    uniq, slots = [], []
    for t in tensors:
        for i, u in enumerate(uniq):
            if t is u:
                slots.append(i)
                break
        else:
            slots.append(len(uniq) if t is not None else -1)
            if t is not None:
                uniq.append(t)
    return uniq, tuple(slots)


_N_INPUTS = 6  # q, k, v, gate, q_sizes, kv_sizes
#: training calls with a gate take the fused-gate forward (with out_s) where the route's forward
#: fuses the gate (benchmarks/ab_vsa_glue.py's ``no-train-gate`` turns it off for its A/B)
_TRAIN_GATE_FUSED = True


def _zeroes_padding(name: str) -> bool:
    backend = BACKENDS.get(name)
    return bool(getattr(backend, "zeroes_kv_padding", False))


def _clean_plan(route: str, kv_sizes: Tensor, block: int, need_grad: bool):
    """``(clean_v, clean_k)``: whether the compression pass also writes V (and K) with their
    padding rows zeroed, for a route whose backend would otherwise copy them to zero it (cuDNN,
    FA4: they read partial kv tiles whole). Only when some kv block is partial (the range check's
    record; unknown, as under torch.compile, counts as partial). The forward needs V clean, a
    backward K and V."""
    parts = route.split(ROUTE_SEP)
    fwd, bwd = parts[0], parts[-1]
    if not has_partial_blocks(kv_sizes, block):
        return False, False
    clean_k = need_grad and _zeroes_padding(bwd)
    return clean_k or _zeroes_padding(fwd), clean_k


def _fuses_gate(route: str) -> bool:
    """Whether the route's forward backend returns ``out_s + gate * out_c`` itself (``sm90``)."""
    return bool(getattr(BACKENDS.get(route.split(ROUTE_SEP)[0]), "fuses_gate", False))


def _op(name: str):
    """The custom op while ``torch.compile`` traces (it must see the op), else its implementation."""
    module = ops if name in ("_fwd", "_bwd", "_fwd_gated", "_fwd_gated_train") else vsa_ops
    return getattr(module, name if torch.compiler.is_compiling() else name + "_impl")


class _VideoSparseAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, slots, topk: int, block: int, bshd: bool, sm_scale: float, route: str, range_checked: bool,
                need_grad: bool, *uniq: Tensor) -> Tensor:
        q, k, v, gate, q_sizes, kv_sizes = (uniq[i] if i >= 0 else None for i in slots)
        if gate is not None and not need_grad and _fuses_gate(route):
            groups = vsa_pipeline.pipelined_groups(q, bshd, block)
            if groups > 1:  # the glue of one head group beside the sparse kernel of the one before
                if not range_checked:
                    check_sizes_range(q_sizes, block, "q_variable_block_sizes")
                    check_sizes_range(kv_sizes, block, "variable_block_sizes")
                return vsa_pipeline.gated_forward_pipelined(q, k, v, gate, q_sizes, kv_sizes, topk=topk, block=block,
                                                            bshd=bshd, sm_scale=sm_scale, route=route, groups=groups)
        clean_v, clean_k = _clean_plan(route, kv_sizes, block, need_grad)
        k_run, v_run = k, v
        if clean_v:
            qc, kc, vc, k_clean, v_run = _op("_compress_clean")(q, k, v, q_sizes, kv_sizes, block, bshd,
                                                                range_checked, clean_k)
            k_run = k_clean if clean_k else k
        else:
            qc, kc, vc = _op("_compress")(q, k, v, q_sizes, kv_sizes, block, bshd, range_checked)
        out_c, out_acc, lse_c, q2k_idx, q2k_num = _op("_select")(qc, kc, vc, kv_sizes, topk, sm_scale, q.dtype,
                                                                  need_grad)
        if gate is not None and not need_grad and _fuses_gate(route):
            # Inference with the gate fused into the forward's epilogue (sm90): no gate pass.
            out = _op("_fwd_gated")(q, k_run, v_run, kv_sizes, block, bshd, sm_scale, route, range_checked,
                                    q2k_idx, q2k_num, gate, out_c)
        elif gate is not None and _TRAIN_GATE_FUSED and _fuses_gate(route):
            # Training, the gate fused the same way; the epilogue also stores out_s for the backward.
            out, out_s, lse_s = _op("_fwd_gated_train")(q, k_run, v_run, kv_sizes, block, bshd, sm_scale, route,
                                                        range_checked, q2k_idx, q2k_num, gate, out_c)
        else:
            out_s, lse_s = _op("_fwd")(q, k_run, v_run, None, kv_sizes, block, bshd, need_grad, sm_scale,
                                       need_grad, route, range_checked, q2k_idx, q2k_num, clean_v)
            out = _op("_gate")(out_s, out_c, gate, block, bshd)
        if need_grad:
            # With clean copies the backward reads them, not k / v: those are not kept (unless
            # they are also q or the gate, which the backward needs).
            keep = list(uniq)
            if clean_k:
                for i, u in enumerate(uniq):
                    if (u is k or u is v) and u is not q and u is not gate:
                        keep[i] = None
            ctx.save_for_backward(*keep, qc, kc, vc, out_c, out_acc if out_acc.numel() else out_c, lse_c,
                                  q2k_idx, q2k_num, out_s, lse_s, k_run if clean_k else None,
                                  v_run if clean_k else None)
        ctx.slots, ctx.n_uniq, ctx.clean_kv = slots, len(uniq), clean_k
        ctx.block, ctx.bshd, ctx.sm_scale, ctx.route = block, bshd, sm_scale, route
        return out

    @staticmethod
    def backward(ctx, dout: Tensor):
        saved = ctx.saved_tensors
        uniq, (qc, kc, vc, out_c, out_acc, lse_c, q2k_idx, q2k_num, out_s, lse_s, k_clean, v_clean) = (
            saved[:ctx.n_uniq], saved[ctx.n_uniq:])
        q, k, v, gate, q_sizes, kv_sizes = (uniq[i] if i >= 0 else None for i in ctx.slots)
        if ctx.clean_kv:  # the backward's K / V are the forward's padding-zeroed copies
            k, v = k_clean, v_clean
        need = ctx.needs_input_grad[8:]  # per unique tensor
        slot_q, slot_k, slot_v, slot_g = ctx.slots[:4]
        block, bshd, sm_scale = ctx.block, ctx.bshd, ctx.sm_scale
        do = dout if dout.stride(-1) == 1 else dout.contiguous()
        d_gate, d_out_c = _op("_gate_bwd")(do, out_c, gate, block, bshd, bool(gate is not None and need[slot_g]))
        dq, dk, dv = _op("_bwd")(do, q, k, v, out_s, lse_s, None, kv_sizes, block, bshd, sm_scale, ctx.route,
                                 q2k_idx, q2k_num, ctx.clean_kv)
        dqc, dkc, dvc = _op("_select_bwd")(d_out_c, qc, kc, vc, kv_sizes, out_acc.to(qc.dtype), lse_c, sm_scale)
        _op("_compress_bwd_accumulate")(dqc, dkc, dvc, q_sizes, kv_sizes, dq, dk, dv, block, bshd)
        grads = [None] * ctx.n_uniq
        for slot, g in ((slot_q, dq), (slot_k, dk), (slot_v, dv), (slot_g, d_gate if gate is not None else None)):
            if g is not None and slot >= 0 and need[slot]:
                grads[slot] = g if grads[slot] is None else grads[slot] + g
        return (None,) * 8 + tuple(grads)


def video_sparse_attn_fn(q: Tensor, k: Tensor, v: Tensor, gate: Optional[Tensor], q_sizes: Tensor,
                         kv_sizes: Tensor, *, topk: int, block: int, bshd: bool, sm_scale: float, route: str,
                         range_checked: bool, need_grad: bool) -> Tensor:
    """Inputs validated by the caller (:mod:`fastvideo_cute.api`), ``route`` chosen by it
    (``"<fwd backend>|<bwd backend>"``). Returns ``out`` in the call layout."""
    uniq, slots = _dedupe((q, k, v, gate, q_sizes, kv_sizes))
    return _VideoSparseAttn.apply(slots, topk, block, bshd, sm_scale, route, range_checked, need_grad, *uniq)
