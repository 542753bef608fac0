"""torch.library custom ops for VSA's glue: compression, selection, gate (forward and backward).

The pieces of ``video_sparse_attn`` around the block-sparse branch, each one opaque custom op
with a fake implementation and registered autograd, so ``torch.compile(fullgraph=True)`` traces
them; each runs the fused Triton kernels (``fastvideo_cute/kernels/triton/vsa_*.py``) on CUDA
tensors (and on CPU tensors under ``TRITON_INTERPRET=1``), and a pure-torch path (the math
``api._video_sparse`` uses) everywhere else: CPU tensors without the interpreter, bf16 CPU tensors
(the interpreter's bf16 arithmetic is wrong), fp64 tensors (for ``gradcheck``), other devices.

Dataflow (``docs/vsa-glue.md``)::

    q, k, v --vsa_compress--> qc, kc, vc (fp32 [B,H,n,D])              1 launch  (bwd: 1)
    qc, kc, vc --vsa_select--> out_c [B,H,Qb,D], q2k_idx, q2k_num       3 launches (bwd: 2)
    out_s, out_c, gate --vsa_gate--> out                                1 launch  (bwd: 1)

Public functions (inputs already validated by the caller's API layer where noted):

- ``vsa_compress(q, k, v, q_sizes, kv_sizes, block, bshd) -> (qc, kc, vc)``; differentiable.
- ``vsa_compress_backward_(dqc, dkc, dvc, q_sizes, kv_sizes, dq, dk, dv, block, bshd)``: adds the
  compression branch's gradient into existing ``dq``/``dk``/``dv`` in place (valid tokens only),
  for a caller that composes its own backward (no extra full-size pass).
- ``vsa_select(qc, kc, vc, kv_sizes, topk, sm_scale, out_dtype) -> (out_c, q2k_idx, q2k_num)``;
  ``out_c`` differentiable w.r.t. ``qc``/``kc``/``vc``; ``q2k_idx [B,H,Qb,k]`` int32 ascending,
  ``q2k_num [B,H,Qb]`` int32 (``k = min(topk, KVb)`` everywhere).
- ``vsa_gate(out_s, out_c, gate, block, bshd) -> out``; differentiable; ``d out_s`` is ``dout``
  itself (no copy).

Memory kept for autograd: compression keeps only the two size vectors; selection keeps ``qc``,
``kc``, ``vc``, an fp32 ``out_c`` (only when ``out_dtype`` is not fp32) and the row LSE
(``[B,H,Qb]``) -- no ``[B,H,Qb,KVb]`` tensor; the gate keeps ``out_c`` and ``gate``.

Size vectors must be contiguous int32 on the tensors' device with values in ``[0, block]``
(``validation.check_block_sizes`` returns that; the range is not re-checked here, it would sync).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from .backends.triton_backend import interpreting
from .validation import check_sizes_range

__all__ = ["vsa_compress", "vsa_compress_backward_", "vsa_select", "vsa_gate"]

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_IN_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_HAS_TRITON: Optional[bool] = None
# tl.dot input_precision of the coarse attention kernels on a GPU (the forward, and S in the
# backward; the backward's gradient products: _COARSE_BWD_GRAD_PRECISION below): "tf32x3" (three
# TF32 tensor-core products, ~fp32 accuracy: the GPU tests compare the selection
# with the fp32 reference at Wan-14B 720p size) measured 1.1x faster end to end than plain fp32
# "ieee" on the H200 (benchmarks/results/vsa_e2e_h200_tf32x3.json vs vsa_e2e_h200.json); the
# interpreter (CPU tensors) runs "ieee".
_COARSE_PRECISION = "tf32x3"
# Glue kernel variants measured on the H200 (benchmarks/bench_glue.py). The first sweeps
# (glue_h200.json, glue_h200_v2.json) timed each call with CUDA events around it, which counts the
# host's launch time whenever the GPU waits for it; since glue_h200_v5.json (--timer kernels) a
# variant is timed by its kernels' GPU time from torch.profiler, what a call inside a busy stream
# costs, and that changed two choices. Wan-1.3B 480p (624 kv blocks) / Wan-14B 720p (1180), 64-token
# tiles, 87.5 %, kernel time:
# - top-k "bisectw1" (vsa_topk_radix: one row per one-warp program, bisection from the row's
#   min/max with value-space midpoints first) 24.6 / 388 us against "rows1w1x" 30.4 / 524 us and
#   "bisectw2" 32.2 / 434 us; the same lists bit for bit (every variant is checked against the
#   one-row search kernel). HunyuanVideo 720p (2160 columns) keeps "bisectw2" from glue_h200_v2.json
#   (587 vs 1089 us for rows1w1x; bisectw1 was not measured there).
# - compress "split" with 1 warp: 75.6 / 556 us against 2 warps 85.6 / 610 us (the former choice)
#   and 4 warps ("split", the same bits as the original kernel) 125 / 978 us. Another fixed fp32
#   summation order per block than the 2-warp kernel's, so block means may differ in the last bits;
#   deterministic. With the evict-first hint on its loads (q, k, v are read once here; the same
#   bits): 69.6 vs 74.8 us at Wan-1.3B, 558 vs 549 us at Wan-14B (glue_h200_v6.json), kept for
#   the 1.3B case, whose forward is at issue 14's 1.3x line.
# Gate 8 warps: 92 vs 99 us (glue_h200.json), the same bits.
_TOPK_VARIANT = "rows1w1x"
# (kv blocks above which the variant applies, variant), widest first; up to _TOPK_WIDE_MAX (64
# keys per lane with two warps: the register budget the rows kernel keeps too), else _TOPK_VARIANT.
_TOPK_WIDE = ((1536, "bisectw2"), (0, "bisectw1"))
_TOPK_WIDE_MAX = 4096


def _topk_variant(kvb: int) -> str:
    """The top-k kernel variant for rows of ``kvb`` scores (see ``_TOPK_WIDE``)."""
    if kvb <= _TOPK_WIDE_MAX:
        for above, variant in _TOPK_WIDE:
            if kvb > above:
                return variant
    return _TOPK_VARIANT
# Coarse forward implementation ("onepass" | "twophase", vsa_select.COARSE_VARIANTS): "twophase"
# (kernels/triton/vsa_coarse_fwd2.py) is a fully parallel scores launch plus a P V launch from the
# stored scores, for the latency-bound one-pass kernel; it needs the scores scratch also when
# topk >= KVb and a small partials scratch (both allocated in _select_impl). Measured on the H200
# (glue_h200_v5.json, kernel time): 68.5 / 984 us at Wan-1.3B / Wan-14B against the one-pass
# kernel's 78.3 / 1153 us. With _COARSE_OVERLAP its phase 2 runs on a second stream (_SideStream)
# while the top-k, which needs only phase 1's scores, runs on the caller's.
_COARSE_VARIANT = "twophase"
_COARSE_OVERLAP = True
# Its tiles (vsa_coarse_fwd2.resolve_fwd2_tiles; None: coarse_fwd2_tiles' defaults), for a sweep.
_COARSE_PHASE_TILES = None
_COMPRESS_CONFIG = {"mode": "split", "num_warps": 1, "evict_first": True}
_GATE_CONFIG = {"num_warps": 8}
# Head groups of a gated inference forward on a route that fuses the gate (sm90): the glue of
# group g + 1 on a second stream beside the sparse kernel of group g (vsa_pipeline); 1 = off.
# Only where each group's sparse kernel still has _GATED_GROUP_MIN_TILES query tiles (B * heads
# per group * Qb; 16384 is ~41 waves of three CTAs on 132 SMs): a split adds a partial last wave
# per group. Measured on the H200 (benchmarks/results/ab_vsa_glue_h200_groups_{13b,14b}.json): Wan-14B
# 720p 2.7 % faster with 2 groups (28,800 tiles each), Wan-1.3B 480p 3 % slower (3,744).
_GATED_HEAD_GROUPS = 2
_GATED_GROUP_MIN_TILES = 16384
_GATED_GLUE_PRIORITY = 0  # the glue stream's priority (torch.cuda.Stream(priority=); < 0 is higher)
# The coarse attention's backward (kernels/triton/vsa_coarse_bwd.py): the tiles of its two phases
# (vsa_coarse_bwd's tiles=; None: coarse_bwd_tiles' defaults) and the precision of its four gradient
# products (grad_precision=; P is recomputed from S = qc kc^T at _COARSE_PRECISION, as the forward
# computed it). Measured on the H200, Wan-1.3B 480p, both phases (do_bench): tf32x3 throughout
# 217 us with the default tiles, 205 us with phase a at two stages (glue_h200_v8.json, _v9.json);
# TF32 gradient products with the default tiles 128 / 135 us at 87.5 / 90 % (_v9.json, the fastest
# of ten tilings), max |err| / max |ref| 1.0e-3 / 9.9e-4 / 4.4e-4 for dqc / dkc / dvc against fp32
# products, within the 2^-9 (half a bf16 ulp) bound the GPU test checks against fp64 autograd
# (tests/kernels/triton/test_vsa_select_triton.py::test_gpu_coarse_backward_as_the_library_runs_it).
_COARSE_BWD_TILES = None  # per-phase tiles for head_dim <= 128 (above: always the defaults)
_COARSE_BWD_GRAD_PRECISION = "tf32"  # None: _COARSE_PRECISION


def _coarse_precision(x: Tensor) -> str:
    return _COARSE_PRECISION if x.is_cuda else "ieee"


# ---------------------------------------------------------------- path choice

def _triton_importable() -> bool:
    global _HAS_TRITON
    if _HAS_TRITON is None:
        _HAS_TRITON = importlib.util.find_spec("triton") is not None
    return _HAS_TRITON


def _use_triton(x: Tensor) -> bool:
    """Whether the fused kernels take tensors like ``x`` (else the torch path runs)."""
    if x.dtype not in _KERNEL_DTYPES or not _triton_importable():
        return False
    if x.is_cuda:
        return True
    if x.device.type == "cpu":
        return x.dtype != torch.bfloat16 and interpreting()
    return False


def _on(x: Tensor):
    """Triton launches on the current CUDA device: make it ``x``'s."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


class _SideStream:
    """A second stream for work that may run beside the caller's next launches (``vsa_select_fwd(
    side=)``: the two-phase coarse forward's phase 2 beside the top-k). ``with side:`` makes the side
    stream wait for everything launched so far on the current stream, then launches on the side
    stream; ``join()`` makes the current stream wait for the side stream's work, so everything the
    caller launches afterwards (and every later reuse of memory freed on the current stream) is
    ordered after it. Works under CUDA-graph capture (the side stream forks from and joins the
    capturing stream). One side stream per device, made on first use."""

    _streams: dict = {}

    def __init__(self, device: torch.device):
        self.main = torch.cuda.current_stream(device)
        index = device.index if device.index is not None else torch.cuda.current_device()
        side = _SideStream._streams.get(index)
        if side is None:
            side = _SideStream._streams[index] = torch.cuda.Stream(device)
        self.side = side
        self._ctx = None

    def __enter__(self):
        self.side.wait_stream(self.main)
        self._ctx = torch.cuda.stream(self.side)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        ctx, self._ctx = self._ctx, None
        return ctx.__exit__(*exc)

    def join(self) -> None:
        self.main.wait_stream(self.side)


def _acc(dtype: torch.dtype) -> torch.dtype:
    """Accumulation / block-mean dtype: fp32, fp64 for fp64 inputs."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _bhsd(x: Tensor, bshd: bool) -> Tensor:
    return x.transpose(1, 2) if bshd else x


def _blocks(x: Tensor, block: int, bshd: bool) -> Tensor:
    """``[B, H, n, block, D]`` view of a call-layout tensor (splitting S is always a view)."""
    if bshd:
        b, s, h, d = x.shape
        return x.view(b, s // block, block, h, d).permute(0, 3, 1, 2, 4)
    b, h, s, d = x.shape
    return x.view(b, h, s // block, block, d)


def _valid(sizes: Tensor, block: int) -> Tensor:
    """``[1, 1, n, block, 1]`` bool: token t of block n is valid iff ``t < sizes[n]``."""
    pos = torch.arange(block, device=sizes.device)
    return (pos[None, :] < sizes[:, None]).view(1, 1, -1, block, 1)


# ---------------------------------------------------------------- torch paths (today's math)

def _mean_torch(x: Tensor, sizes: Tensor, block: int, bshd: bool) -> Tensor:
    acc = _acc(x.dtype)
    xb = _blocks(x, block, bshd)
    total = torch.where(_valid(sizes, block), xb, torch.zeros((), dtype=x.dtype, device=x.device)).sum(3, dtype=acc)
    return (total / sizes.clamp(min=1).to(acc).view(1, 1, -1, 1)).contiguous()


def _spread_torch(dxc: Tensor, sizes: Tensor, block: int) -> Tensor:
    """``[B, H, n, block, D]`` acc-dtype gradient of the mean: ``dxc / size`` at valid tokens, 0 elsewhere."""
    g = (dxc / sizes.clamp(min=1).to(dxc.dtype).view(1, 1, -1, 1)).unsqueeze(3)
    return torch.where(_valid(sizes, block), g, torch.zeros((), dtype=g.dtype, device=g.device))


def _select_torch(qc, kc, vc, kv_sizes, topk, sm_scale):
    kvb = kc.shape[2]
    empty = (kv_sizes == 0).view(1, 1, 1, kvb)
    scores = (torch.matmul(qc, kc.transpose(-2, -1)) * sm_scale).masked_fill(empty, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    # If every kv block is empty the coarse attention has nothing to attend to: out_c = 0.
    probs = torch.softmax(scores.masked_fill(empty.all(), 0.0), dim=-1).masked_fill(empty, 0.0)
    out_acc = torch.matmul(probs, vc)
    k = min(topk, kvb)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    idx = order.sort(dim=-1).values.to(torch.int32)
    num = torch.full(scores.shape[:3], k, dtype=torch.int32, device=qc.device)
    return out_acc, lse, idx, num


def _select_bwd_torch(dout, qc, kc, vc, kv_sizes, out_acc, lse, sm_scale):
    kvb = kc.shape[2]
    empty = (kv_sizes == 0).view(1, 1, 1, kvb)
    scores = (torch.matmul(qc, kc.transpose(-2, -1)) * sm_scale).masked_fill(empty, float("-inf"))
    lse_safe = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    probs = torch.exp(scores - lse_safe.unsqueeze(-1))  # P recomputed from the LSE; 0 at empty blocks
    do = dout.to(qc.dtype)
    dvc = torch.matmul(probs.transpose(-2, -1), do)
    dp = torch.matmul(do, vc.transpose(-2, -1))
    ds = probs * (dp - (do * out_acc).sum(-1, keepdim=True))
    return torch.matmul(ds, kc) * sm_scale, torch.matmul(ds.transpose(-2, -1), qc) * sm_scale, dvc


def _gate_torch(out_s, out_c, gate, block, bshd):
    oc = out_c.transpose(1, 2).unsqueeze(2) if bshd else out_c.unsqueeze(3)  # [B,Qb,1,H,D] / [B,H,Qb,1,D]
    view = _blocks_shape(out_s.shape, block, bshd)
    prod = oc * gate.reshape(view) if gate is not None else oc
    return (out_s.reshape(view) + prod).to(out_s.dtype).reshape(out_s.shape).contiguous()


def _blocks_shape(shape, block, bshd):
    if bshd:
        b, s, h, d = shape
        return (b, s // block, block, h, d)
    b, h, s, d = shape
    return (b, h, s // block, block, d)


def _gate_bwd_torch(dout, out_c, gate, block, bshd, need_dgate):
    view = _blocks_shape(dout.shape, block, bshd)
    oc = out_c.transpose(1, 2).unsqueeze(2) if bshd else out_c.unsqueeze(3)
    do = dout.reshape(view)
    tok_dim = 2 if bshd else 3
    if gate is not None:
        d_gate = (do * oc).to(gate.dtype).reshape(dout.shape).contiguous() if need_dgate else dout.new_empty(0)
        summed = (do * gate.reshape(view)).sum(tok_dim, dtype=_acc(out_c.dtype))
    else:
        d_gate = dout.new_empty(0)
        summed = do.sum(tok_dim, dtype=_acc(out_c.dtype))
    d_out_c = (summed.transpose(1, 2) if bshd else summed).to(out_c.dtype).contiguous()
    return d_gate, d_out_c


# ---------------------------------------------------------------- compression ops

def _seq(x: Tensor, bshd: bool) -> int:
    return x.shape[1] if bshd else x.shape[2]


def _means_shape(x: Tensor, block: int, bshd: bool) -> Tuple[int, int, int, int]:
    b, h = x.shape[0], (x.shape[2] if bshd else x.shape[1])
    return b, h, _seq(x, bshd) // block, x.shape[3]


def _compress_triton(q, k, v, q_sizes, kv_sizes, block: int, bshd: bool, k_out=None, v_out=None):
    """The compression kernel's launch (block means; optionally the padding-zeroed K/V copies)."""
    from .kernels.triton.vsa_compress import vsa_compress_fwd

    qc = torch.empty(_means_shape(q, block, bshd), dtype=torch.float32, device=q.device)
    kc = torch.empty(_means_shape(k, block, bshd), dtype=torch.float32, device=q.device)
    vc = torch.empty_like(kc)
    with _on(q):
        vsa_compress_fwd(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), q_sizes, kv_sizes, qc, kc, vc,
                         block=block, config=_COMPRESS_CONFIG,
                         k_out=None if k_out is None else _bhsd(k_out, bshd),
                         v_out=None if v_out is None else _bhsd(v_out, bshd))
    return qc, kc, vc


def _compress_impl(q: Tensor, k: Tensor, v: Tensor, q_sizes: Tensor, kv_sizes: Tensor, block: int,
              bshd: bool, range_checked: bool) -> Tuple[Tensor, Tensor, Tensor]:
    if not range_checked:  # e.g. traced by torch.compile, where the API's eager check does not run
        check_sizes_range(q_sizes, block, "q_variable_block_sizes")
        check_sizes_range(kv_sizes, block, "variable_block_sizes")
    if _use_triton(q):
        return _compress_triton(q, k, v, q_sizes, kv_sizes, block, bshd)
    return (_mean_torch(q, q_sizes, block, bshd), _mean_torch(k, kv_sizes, block, bshd),
            _mean_torch(v, kv_sizes, block, bshd))


_compress = torch.library.custom_op("fastvideo_cute::vsa_compress", mutates_args=())(_compress_impl)


@_compress.register_fake
def _compress_fake(q, k, v, q_sizes, kv_sizes, block, bshd, range_checked):
    acc = _acc(q.dtype)
    kc = k.new_empty(_means_shape(k, block, bshd), dtype=acc)
    return q.new_empty(_means_shape(q, block, bshd), dtype=acc), kc, torch.empty_like(kc)


def _copy_zero_padding_torch(out: Tensor, x: Tensor, sizes: Tensor, block: int, bshd: bool) -> None:
    """``out[:] = x`` with every padding row zeroed (``out`` contiguous, call layout)."""
    out.copy_(x)
    _blocks(out, block, bshd).masked_fill_(~_valid(sizes, block), 0)  # [B, H, n, block, D] view


def _compress_clean_impl(q: Tensor, k: Tensor, v: Tensor, q_sizes: Tensor, kv_sizes: Tensor, block: int,
                         bshd: bool, range_checked: bool, clean_k: bool
                         ) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """:func:`_compress_impl` that also returns v (and k, with ``clean_k``; else an empty tensor)
    copied with every padding row zeroed (contiguous, call layout), in the same pass: what a
    route that reads partial kv tiles whole (cuDNN, FA4) needs, so it makes no copy of its own."""
    if not range_checked:
        check_sizes_range(q_sizes, block, "q_variable_block_sizes")
        check_sizes_range(kv_sizes, block, "variable_block_sizes")
    v_clean = torch.empty_like(v, memory_format=torch.contiguous_format)
    k_clean = torch.empty_like(k, memory_format=torch.contiguous_format) if clean_k else k.new_empty(0)
    if _use_triton(q):
        qc, kc, vc = _compress_triton(q, k, v, q_sizes, kv_sizes, block, bshd, k_clean if clean_k else None, v_clean)
        return qc, kc, vc, k_clean, v_clean
    qc, kc, vc = _compress_impl(q, k, v, q_sizes, kv_sizes, block, bshd, True)
    _copy_zero_padding_torch(v_clean, v, kv_sizes, block, bshd)
    if clean_k:
        _copy_zero_padding_torch(k_clean, k, kv_sizes, block, bshd)
    return qc, kc, vc, k_clean, v_clean


_compress_clean = torch.library.custom_op("fastvideo_cute::vsa_compress_clean", mutates_args=())(_compress_clean_impl)


@_compress_clean.register_fake
def _compress_clean_fake(q, k, v, q_sizes, kv_sizes, block, bshd, range_checked, clean_k):
    qc, kc, vc = _compress_fake(q, k, v, q_sizes, kv_sizes, block, bshd, range_checked)
    k_clean = torch.empty_like(k, memory_format=torch.contiguous_format) if clean_k else k.new_empty(0)
    return qc, kc, vc, k_clean, torch.empty_like(v, memory_format=torch.contiguous_format)


def _compress_bwd_impl(dqc: Optional[Tensor], dkc: Optional[Tensor], dvc: Optional[Tensor], q_sizes: Tensor,
                  kv_sizes: Tensor, q_shape: List[int], kv_shape: List[int], dtype: torch.dtype, block: int,
                  bshd: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """Fresh dq/dk/dv (call layout, contiguous, ``dtype``); an absent mean gradient gives a
    0-element tensor (the autograd formula maps it to None)."""
    dev = q_sizes.device
    pairs = ((dqc, q_sizes, q_shape), (dkc, kv_sizes, kv_shape), (dvc, kv_sizes, kv_shape))
    outs = [torch.empty(shape, dtype=dtype, device=dev) if g is not None else torch.empty(0, dtype=dtype, device=dev)
            for g, _, shape in pairs]
    probe = torch.empty(0, dtype=dtype, device=dev)
    if _use_triton(probe):
        from .kernels.triton.vsa_compress import vsa_compress_bwd

        gs = [g.contiguous() if g is not None else None for g, _, _ in pairs]
        xs = [_bhsd(o, bshd) if g is not None else None for o, g in zip(outs, gs)]
        with _on(probe):
            vsa_compress_bwd(gs[0], gs[1], gs[2], q_sizes, kv_sizes, xs[0], xs[1], xs[2], block=block,
                             accumulate=False)
        return outs[0], outs[1], outs[2]
    for out, (g, sizes, _) in zip(outs, pairs):
        if g is not None:
            _blocks(out, block, bshd).copy_(_spread_torch(g.to(_acc(dtype)), sizes, block))
    return outs[0], outs[1], outs[2]


_compress_bwd = torch.library.custom_op("fastvideo_cute::vsa_compress_bwd", mutates_args=())(_compress_bwd_impl)


@_compress_bwd.register_fake
def _compress_bwd_fake(dqc, dkc, dvc, q_sizes, kv_sizes, q_shape, kv_shape, dtype, block, bshd):
    dev = q_sizes.device
    return tuple(torch.empty(shape if g is not None else (0,), dtype=dtype, device=dev)
                 for g, shape in ((dqc, q_shape), (dkc, kv_shape), (dvc, kv_shape)))


def _compress_setup(ctx, inputs, output):
    q, k, v, q_sizes, kv_sizes, block, bshd, _ = inputs
    ctx.save_for_backward(q_sizes, kv_sizes)  # nothing full-size
    ctx.q_shape, ctx.kv_shape, ctx.dtype = list(q.shape), list(k.shape), q.dtype
    ctx.block, ctx.bshd = block, bshd


def _compress_backward(ctx, dqc, dkc, dvc):
    q_sizes, kv_sizes = ctx.saved_tensors
    need = ctx.needs_input_grad
    grads = [g if (g is not None and need[i]) else None for i, g in enumerate((dqc, dkc, dvc))]
    if all(g is None for g in grads):
        return None, None, None, None, None, None, None, None
    dq, dk, dv = _compress_bwd(grads[0], grads[1], grads[2], q_sizes, kv_sizes, ctx.q_shape, ctx.kv_shape, ctx.dtype,
                               ctx.block, ctx.bshd)
    out = [d if g is not None else None for d, g in zip((dq, dk, dv), grads)]
    return out[0], out[1], out[2], None, None, None, None, None


torch.library.register_autograd("fastvideo_cute::vsa_compress", _compress_backward, setup_context=_compress_setup)


def _compress_bwd_accumulate_impl(dqc: Optional[Tensor], dkc: Optional[Tensor], dvc: Optional[Tensor], q_sizes: Tensor,
                             kv_sizes: Tensor, dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor],
                             block: int, bshd: bool) -> None:
    present = [x for x in (dq, dk, dv) if x is not None]
    if not present:
        return
    if all(_use_triton(x) for x in present):
        from .kernels.triton.vsa_compress import vsa_compress_bwd

        gs = [g.contiguous() if g is not None else None for g in (dqc, dkc, dvc)]
        xs = [_bhsd(x, bshd) if x is not None else None for x in (dq, dk, dv)]
        with _on(present[0]):
            vsa_compress_bwd(gs[0], gs[1], gs[2], q_sizes, kv_sizes, xs[0], xs[1], xs[2], block=block,
                             accumulate=True)
        return
    for g, sizes, x in ((dqc, q_sizes, dq), (dkc, kv_sizes, dk), (dvc, kv_sizes, dv)):
        if x is not None:
            xb = _blocks(x, block, bshd)
            valid = _valid(sizes, block)
            added = (xb.to(_acc(x.dtype)) + _spread_torch(g.to(_acc(x.dtype)), sizes, block)).to(x.dtype)
            xb.copy_(torch.where(valid, added, xb))  # padding rewritten with its own bits


_compress_bwd_accumulate = torch.library.custom_op("fastvideo_cute::vsa_compress_bwd_accumulate",
                                                   mutates_args=("dq", "dk", "dv"))(_compress_bwd_accumulate_impl)


@_compress_bwd_accumulate.register_fake
def _compress_bwd_accumulate_fake(dqc, dkc, dvc, q_sizes, kv_sizes, dq, dk, dv, block, bshd):
    return None


# ---------------------------------------------------------------- selection ops

def _select_impl(qc: Tensor, kc: Tensor, vc: Tensor, kv_sizes: Tensor, topk: int, sm_scale: float,
            out_dtype: torch.dtype, need_grad: bool) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """-> (out_c, out_acc, lse, q2k_idx, q2k_num). ``out_acc`` is the accumulation-dtype out_c kept
    for the backward when ``need_grad`` and ``out_dtype`` differs from it, else 0 elements."""
    b, h, qb, d = qc.shape
    kvb = kc.shape[2]
    acc = qc.dtype
    keep_acc = need_grad and out_dtype != acc
    if _use_triton(qc):
        from .kernels.triton.vsa_select import MAX_KV_BLOCKS, vsa_select_fwd

        if kvb <= MAX_KV_BLOCKS:
            k = min(topk, kvb)
            dev = qc.device
            out = torch.empty((b, h, qb, d), dtype=out_dtype, device=dev)
            out_acc = torch.empty((b, h, qb, d) if keep_acc else (0,), dtype=acc, device=dev)
            lse = torch.empty((b, h, qb), dtype=torch.float32, device=dev)
            idx = torch.empty((b, h, qb, k), dtype=torch.int32, device=dev)
            num = torch.empty((b, h, qb), dtype=torch.int32, device=dev)
            two_phase = _COARSE_VARIANT == "twophase"
            scores = torch.empty((b, h, qb, kvb), dtype=torch.float32, device=dev) if k < kvb or two_phase else None
            coarse = {}
            if two_phase:  # the partial (max, sum) per row and kv tile, freed on return as the scores
                from .kernels.triton.vsa_coarse_fwd2 import coarse_fwd2_scratch_numel

                coarse = dict(coarse_variant="twophase", phase_tiles=_COARSE_PHASE_TILES, partial_scratch=torch.empty(
                    coarse_fwd2_scratch_numel(b, h, qb, kvb, d, _COARSE_PHASE_TILES), dtype=torch.float32, device=dev))
                if _COARSE_OVERLAP and qc.is_cuda:
                    coarse["side"] = _SideStream(qc.device)
            with _on(qc):
                vsa_select_fwd(qc.contiguous(), kc.contiguous(), vc.contiguous(), kv_sizes, out,
                               out_acc if keep_acc else None, lse, idx, num, scores, topk=topk, sm_scale=sm_scale,
                               precision=_coarse_precision(qc), topk_variant=_topk_variant(kvb), **coarse)
            return out, out_acc, lse, idx, num
    out_acc, lse, idx, num = _select_torch(qc, kc, vc, kv_sizes, topk, sm_scale)
    out = out_acc.to(out_dtype)
    return out, (out_acc if keep_acc else out_acc.new_empty(0)), lse, idx, num


_select = torch.library.custom_op("fastvideo_cute::vsa_select", mutates_args=())(_select_impl)


@_select.register_fake
def _select_fake(qc, kc, vc, kv_sizes, topk, sm_scale, out_dtype, need_grad):
    b, h, qb, d = qc.shape
    k = min(topk, kc.shape[2])
    keep_acc = need_grad and out_dtype != qc.dtype
    return (qc.new_empty((b, h, qb, d), dtype=out_dtype), qc.new_empty((b, h, qb, d) if keep_acc else (0,)),
            qc.new_empty((b, h, qb)), qc.new_empty((b, h, qb, k), dtype=torch.int32),
            qc.new_empty((b, h, qb), dtype=torch.int32))


def _select_bwd_impl(dout: Tensor, qc: Tensor, kc: Tensor, vc: Tensor, kv_sizes: Tensor, out_acc: Tensor, lse: Tensor,
                sm_scale: float) -> Tuple[Tensor, Tensor, Tensor]:
    if _use_triton(qc):
        from .kernels.triton.vsa_coarse_bwd import vsa_coarse_bwd

        dqc, dkc, dvc = torch.empty_like(qc), torch.empty_like(kc), torch.empty_like(vc)
        # P and dS of the two-phase kernel, [2, B, H, Qb, KVb] fp32 in one allocation, freed on return
        # (the forward's scores scratch is half that size).
        b, h, qb, _ = qc.shape
        scratch = torch.empty((2, b, h, qb, kc.shape[2]), dtype=torch.float32, device=qc.device)
        with _on(qc):
            precision = _coarse_precision(qc)
            grad_precision = _COARSE_BWD_GRAD_PRECISION if qc.is_cuda else None  # interpreter: "ieee"
            vsa_coarse_bwd(qc.contiguous(), kc.contiguous(), vc.contiguous(), kv_sizes, dout.contiguous(),
                           out_acc.contiguous(), lse.contiguous(), dqc, dkc, dvc, sm_scale=sm_scale,
                           precision=precision, p_scratch=scratch[0], ds_scratch=scratch[1],
                           tiles=_COARSE_BWD_TILES if qc.shape[-1] <= 128 else None,
                           grad_precision=grad_precision)
        return dqc, dkc, dvc
    dqc, dkc, dvc = _select_bwd_torch(dout, qc, kc, vc, kv_sizes, out_acc, lse, sm_scale)
    return dqc.contiguous(), dkc.contiguous(), dvc.contiguous()


_select_bwd = torch.library.custom_op("fastvideo_cute::vsa_select_bwd", mutates_args=())(_select_bwd_impl)


@_select_bwd.register_fake
def _select_bwd_fake(dout, qc, kc, vc, kv_sizes, out_acc, lse, sm_scale):
    return torch.empty_like(qc), torch.empty_like(kc), torch.empty_like(vc)


def _select_setup(ctx, inputs, output):
    qc, kc, vc, kv_sizes, topk, sm_scale, out_dtype, need_grad = inputs
    out, out_acc, lse, _, _ = output
    ctx.save_for_backward(qc, kc, vc, kv_sizes, out_acc if out_acc.numel() else out, lse)
    ctx.sm_scale = sm_scale


def _select_backward(ctx, dout, dout_acc, dlse, didx, dnum):
    qc, kc, vc, kv_sizes, out_acc, lse = ctx.saved_tensors
    if dout is None:
        return None, None, None, None, None, None, None, None
    dqc, dkc, dvc = _select_bwd(dout, qc, kc, vc, kv_sizes, out_acc.to(qc.dtype), lse, ctx.sm_scale)
    need = ctx.needs_input_grad
    return (dqc if need[0] else None, dkc if need[1] else None, dvc if need[2] else None,
            None, None, None, None, None)


torch.library.register_autograd("fastvideo_cute::vsa_select", _select_backward, setup_context=_select_setup)


# ---------------------------------------------------------------- gate ops

def _gate_impl(out_s: Tensor, out_c: Tensor, gate: Optional[Tensor], block: int, bshd: bool) -> Tensor:
    if _use_triton(out_s) and _use_triton(out_c):
        from .kernels.triton.vsa_gate import vsa_gate_fwd

        out = torch.empty(out_s.shape, dtype=out_s.dtype, device=out_s.device)
        with _on(out_s):
            vsa_gate_fwd(_bhsd(out_s, bshd), out_c, _bhsd(gate, bshd) if gate is not None else None,
                         _bhsd(out, bshd), block=block, config=_GATE_CONFIG)
        return out
    return _gate_torch(out_s, out_c, gate, block, bshd)


_gate = torch.library.custom_op("fastvideo_cute::vsa_gate", mutates_args=())(_gate_impl)


@_gate.register_fake
def _gate_fake(out_s, out_c, gate, block, bshd):
    return torch.empty_like(out_s, memory_format=torch.contiguous_format)


def _gate_bwd_impl(dout: Tensor, out_c: Tensor, gate: Optional[Tensor], block: int, bshd: bool,
              need_dgate: bool) -> Tuple[Tensor, Tensor]:
    """-> (d_gate (0 elements without a gate or when not needed), d_out_c)."""
    if _use_triton(dout) and _use_triton(out_c):
        from .kernels.triton.vsa_gate import vsa_gate_bwd

        with_gate = gate is not None and need_dgate
        d_gate = torch.empty(gate.shape if with_gate else (0,), dtype=dout.dtype if gate is None else gate.dtype,
                             device=dout.device)
        d_out_c = torch.empty(out_c.shape, dtype=out_c.dtype, device=out_c.device)
        with _on(dout):
            vsa_gate_bwd(_bhsd(dout, bshd), out_c, _bhsd(gate, bshd) if gate is not None else None,
                         _bhsd(d_gate, bshd) if with_gate else None, d_out_c, block=block)
        return d_gate, d_out_c
    return _gate_bwd_torch(dout, out_c, gate, block, bshd, need_dgate)


_gate_bwd = torch.library.custom_op("fastvideo_cute::vsa_gate_bwd", mutates_args=())(_gate_bwd_impl)


@_gate_bwd.register_fake
def _gate_bwd_fake(dout, out_c, gate, block, bshd, need_dgate):
    with_gate = gate is not None and need_dgate
    d_gate = dout.new_empty(gate.shape if with_gate else (0,), dtype=dout.dtype if gate is None else gate.dtype)
    return d_gate, torch.empty_like(out_c, memory_format=torch.contiguous_format)


def _gate_setup(ctx, inputs, output):
    out_s, out_c, gate, block, bshd = inputs
    ctx.save_for_backward(out_c, gate)
    ctx.block, ctx.bshd = block, bshd


def _gate_backward(ctx, dout):
    out_c, gate = ctx.saved_tensors
    need = ctx.needs_input_grad
    if not (need[1] or need[2]):
        return dout, None, None, None, None
    do = dout if dout.stride(-1) == 1 else dout.contiguous()
    d_gate, d_out_c = _gate_bwd(do, out_c, gate, ctx.block, ctx.bshd, bool(need[2]))
    return (dout if need[0] else None, d_out_c if need[1] else None,
            d_gate if (gate is not None and need[2]) else None, None, None)


torch.library.register_autograd("fastvideo_cute::vsa_gate", _gate_backward, setup_context=_gate_setup)


# ---------------------------------------------------------------- public functions

def _check_4d(name: str, x, dtypes=_IN_DTYPES) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        raise ValueError(f"{name} must be 4-D, got shape {tuple(x.shape)}")
    if x.dtype not in dtypes:
        raise TypeError(f"{name} must have a dtype in {[str(t) for t in dtypes]}, got {x.dtype}")
    if x.stride(-1) != 1 and x.shape[-1] != 1:
        raise ValueError(f"{name} must have a contiguous last dimension, got strides {tuple(x.stride())}")


def _check_block(block) -> None:
    if isinstance(block, bool) or not isinstance(block, int) or block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power-of-two int >= 16 (64, 128 or 256 for VSA), got {block!r}")


def _check_sizes(name: str, sizes, n: int, device: torch.device) -> None:
    if not isinstance(sizes, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(sizes).__name__}")
    if sizes.dtype != torch.int32:
        raise TypeError(f"{name} must be int32 (validation.check_block_sizes converts), got {sizes.dtype}")
    if sizes.device != device:
        raise ValueError(f"{name} must be on {device}, got {sizes.device}")
    if sizes.dim() != 1 or sizes.numel() != n or not sizes.is_contiguous():
        raise ValueError(f"{name} must be a contiguous 1-D tensor of {n} entries, got shape {list(sizes.shape)}")


def _check_same(name: str, x: Tensor, ref: Tensor, ref_name: str, dtype: bool = True) -> None:
    if dtype and x.dtype != ref.dtype:
        raise TypeError(f"{name} must have {ref_name}'s dtype {ref.dtype}, got {x.dtype}")
    if x.device != ref.device:
        raise ValueError(f"{name} must be on {ref_name}'s device {ref.device}, got {x.device}")


def _layout_dims(x: Tensor, bshd: bool) -> Tuple[int, int, int, int]:
    """(B, H, S, D) of a call-layout tensor."""
    return (x.shape[0], x.shape[2], x.shape[1], x.shape[3]) if bshd else tuple(x.shape)


def vsa_compress(q: Tensor, k: Tensor, v: Tensor, q_sizes: Tensor, kv_sizes: Tensor, block: int,
                 bshd: bool, range_checked: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Block means over the valid (leading) tokens: ``(qc, kc, vc)``, fp32 (fp64 for fp64 input)
    contiguous ``[B, H, n, D]``; q uses ``q_sizes``, k and v ``kv_sizes``; a block of size 0 has
    mean 0. ``q``/``k``/``v`` are ``[B, H, S, D]`` (``[B, S, H, D]`` when ``bshd``). Differentiable:
    the gradient reaches the valid tokens only (padding gets exact 0)."""
    _check_block(block)
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_4d(name, x)
    for name, x in (("k", k), ("v", v)):
        _check_same(name, x, q, "q")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    qd, kd = _layout_dims(q, bshd), _layout_dims(k, bshd)
    if qd[0] != kd[0] or qd[1] != kd[1] or qd[3] != kd[3]:
        raise ValueError(f"q and k must share batch, heads and head_dim, got q {tuple(q.shape)}, k {tuple(k.shape)}")
    for name, s in (("q", qd[2]), ("k", kd[2])):
        if s == 0 or s % block:
            raise ValueError(f"{name}'s sequence length {s} must be a positive multiple of block {block}")
    _check_sizes("q_sizes", q_sizes, qd[2] // block, q.device)
    _check_sizes("kv_sizes", kv_sizes, kd[2] // block, q.device)
    return _compress(q, k, v, q_sizes, kv_sizes, block, bshd, bool(range_checked))


def vsa_compress_backward_(dqc: Optional[Tensor], dkc: Optional[Tensor], dvc: Optional[Tensor], q_sizes: Tensor,
                           kv_sizes: Tensor, dq: Optional[Tensor], dk: Optional[Tensor], dv: Optional[Tensor],
                           block: int, bshd: bool) -> None:
    """Add the block means' gradient into existing ``dq``/``dk``/``dv`` (call layout), in place:
    ``dx[token] += dxc[block] / size`` at the valid tokens; padding tokens are not touched. Each
    ``(dxc, dx)`` pair may be ``(None, None)``. One launch on the Triton path; not differentiable."""
    _check_block(block)
    for name, g, x, sizes in (("dq", dqc, dq, q_sizes), ("dk", dkc, dk, kv_sizes), ("dv", dvc, dv, kv_sizes)):
        if (g is None) != (x is None):
            raise ValueError(f"{name} and its mean gradient must both be given or both be None")
        if x is None:
            continue
        _check_4d(name, x)
        _check_4d(name + "c", g, (torch.float32, torch.float64))
        b, h, s, d = _layout_dims(x, bshd)
        if s % block or tuple(g.shape) != (b, h, s // block, d):
            raise ValueError(f"{name}c must have shape {[b, h, s // block, d]} for {name} {tuple(x.shape)}")
        _check_same(name + "c", g, x, name, dtype=False)
        _check_sizes("q_sizes" if name == "dq" else "kv_sizes", sizes, s // block, x.device)
    _compress_bwd_accumulate(dqc, dkc, dvc, q_sizes, kv_sizes, dq, dk, dv, block, bshd)


def vsa_select(qc: Tensor, kc: Tensor, vc: Tensor, kv_sizes: Tensor, topk: int, sm_scale: float,
               out_dtype: torch.dtype) -> Tuple[Tensor, Tensor, Tensor]:
    """Coarse attention + top-k: ``(out_c, q2k_idx, q2k_num)``.

    ``scores = qc @ kc^T * sm_scale`` (fp32; ``-inf`` for kv blocks of size 0); ``out_c =
    softmax(scores) @ vc`` (0 if every kv block is empty) cast to ``out_dtype``, ``[B, H, Qb, D]``,
    differentiable w.r.t. ``qc``/``kc``/``vc``; ``q2k_idx [B, H, Qb, k]`` int32: per row the ``k =
    min(topk, KVb)`` kv blocks of the largest scores (ties to the lowest index, NaN first: a stable
    descending sort's first ``k``), ascending; ``q2k_num [B, H, Qb]`` int32, all ``k``.
    """
    for name, x in (("qc", qc), ("kc", kc), ("vc", vc)):
        _check_4d(name, x, (torch.float32, torch.float64))
    for name, x in (("kc", kc), ("vc", vc)):
        _check_same(name, x, qc, "qc")
    if kc.shape != vc.shape or kc.shape[:2] != qc.shape[:2] or kc.shape[3] != qc.shape[3]:
        raise ValueError(f"qc [B,H,Qb,D], kc and vc [B,H,KVb,D] must agree, got {tuple(qc.shape)}, "
                         f"{tuple(kc.shape)}, {tuple(vc.shape)}")
    if qc.shape[2] == 0 or kc.shape[2] == 0:
        raise ValueError(f"qc and kc need at least one block, got {tuple(qc.shape)} and {tuple(kc.shape)}")
    _check_sizes("kv_sizes", kv_sizes, kc.shape[2], qc.device)
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be a positive int, got {topk!r}")
    if isinstance(sm_scale, bool) or not isinstance(sm_scale, (int, float)) or not (sm_scale > 0 and
                                                                                    math.isfinite(sm_scale)):
        raise ValueError(f"sm_scale must be a positive finite float, got {sm_scale!r}")
    if not isinstance(out_dtype, torch.dtype) or out_dtype not in _IN_DTYPES:
        raise TypeError(f"out_dtype must be one of {[str(t) for t in _IN_DTYPES]}, got {out_dtype!r}")
    need_grad = torch.is_grad_enabled() and (qc.requires_grad or kc.requires_grad or vc.requires_grad)
    out, _, _, idx, num = _select(qc, kc, vc, kv_sizes, topk, float(sm_scale), out_dtype, need_grad)
    return out, idx, num


def vsa_gate(out_s: Tensor, out_c: Tensor, gate: Optional[Tensor], block: int, bshd: bool) -> Tensor:
    """``out = out_s + gate * out_c`` (``out_s + out_c`` when ``gate`` is None), ``out_c [B, H, Qb,
    D]`` broadcast over each q block's tokens; ``out_s``/``gate`` in the call layout (``[B, S, H,
    D]`` when ``bshd``). fp32 arithmetic, rounded once to ``out_s``'s dtype; the result is new
    (``out_s`` is not modified). Differentiable in all three; ``d out_s`` is ``dout`` itself."""
    _check_block(block)
    _check_4d("out_s", out_s)
    _check_4d("out_c", out_c)
    _check_same("out_c", out_c, out_s, "out_s", dtype=False)
    b, h, s, d = _layout_dims(out_s, bshd)
    if s % block or tuple(out_c.shape) != (b, h, s // block, d):
        raise ValueError(f"out_c must have shape {[b, h, s // block, d]} for out_s {tuple(out_s.shape)}, "
                         f"got {tuple(out_c.shape)}")
    if gate is not None:
        _check_4d("gate", gate)
        _check_same("gate", gate, out_s, "out_s")
        if gate.shape != out_s.shape:
            raise ValueError(f"gate must have out_s's shape {tuple(out_s.shape)}, got {tuple(gate.shape)}")
    return _gate(out_s, out_c, gate, block, bshd)
