"""Backward of VSA's coarse attention (``out_c = softmax(qc kc^T * sm_scale) vc``) in one launch.

Inputs: the forward's ``qc``/``kc``/``vc`` (fp32 ``[B, H, n, D]``), ``kv_sizes`` (kv blocks of
size 0 were ``-inf`` columns), ``dout`` (``d out_c``, any float dtype, ``[B, H, Qb, D]``), the
forward's fp32 ``out_c`` and its natural-log row LSE. ``P`` is recomputed from the LSE
(``P = exp(s - lse)``), so no ``[Qb, KVb]`` tensor is kept between forward and backward; a row with
LSE ``-inf`` (every kv block empty) uses ``+inf`` so its ``P`` is 0 and nothing turns NaN.

One kernel, two kinds of programs in one grid ``(cdiv(Qb, BLOCK_Q) + cdiv(KVb, BLOCK_KV), B * H)``:

- ``pid < NQT``: a ``BLOCK_Q``-row tile of q blocks walks every kv chunk:
  ``dqc = sm_scale * sum_j dS_j kc_j`` with ``dS = P * (dout vc^T - delta)``,
  ``delta = rowsum(dout * out_c)``;
- otherwise: a ``BLOCK_KV`` tile of kv blocks walks every q chunk:
  ``dvc = P^T dout``, ``dkc = sm_scale * dS^T qc`` (``delta`` recomputed per q chunk, no
  preprocess launch).

Every output element is written by one program, summed in a fixed order: deterministic, no
atomics. fp32 throughout (``tl.dot(..., input_precision="ieee")`` by default). Outputs are fp32 contiguous
``[B, H, n, D]``, written into caller-allocated tensors on the current CUDA device. This module
does not import torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .vsa_common import dtype_name
from .vsa_select import COARSE_PRECISIONS, coarse_tiles

__all__ = ["vsa_coarse_bwd"]


@triton.jit
def _q_tile(QC, DO, O, LSE, bh, r0, Qb, D, offs_d, dmask, BLOCK_Q: tl.constexpr):
    """Rows ``r0 .. r0+BLOCK_Q`` of one (b, h): qc, dout (fp32), delta, log2-domain lse, row mask."""
    rows = r0 + tl.arange(0, BLOCK_Q)
    rmask = rows < Qb
    q_rows = bh * Qb + rows.to(tl.int64)
    ptrs = q_rows[:, None] * D + offs_d[None, :]
    m2 = rmask[:, None] & dmask[None, :]
    qc = tl.load(QC + ptrs, mask=m2, other=0.0)
    do = tl.load(DO + ptrs, mask=m2, other=0.0).to(tl.float32)
    o = tl.load(O + ptrs, mask=m2, other=0.0)
    delta = tl.sum(do * o, 1)
    lse = tl.load(LSE + q_rows, mask=rmask, other=float("-inf"))
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    return qc, do, delta, lse2, rmask, q_rows


@triton.jit
def _vsa_coarse_bwd_kernel(
    QC, KC, VC, KV_SIZES, DO, O, LSE, DQC, DKC, DVC,
    Qb, KVb, D, NQT,
    sm_scale,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    kv_base = bh * KVb * D
    if pid < NQT:
        qc, do, delta, lse2, rmask, q_rows = _q_tile(QC, DO, O, LSE, bh, pid * BLOCK_Q, Qb, D, offs_d, dmask,
                                                     BLOCK_Q)
        dq = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
        for c0 in range(0, KVb, BLOCK_KV):
            cols = c0 + tl.arange(0, BLOCK_KV)
            cmask = cols < KVb
            present = tl.load(KV_SIZES + cols, mask=cmask, other=0) > 0
            tile = cols.to(tl.int64)[:, None] * D + offs_d[None, :]
            kmask = cmask[:, None] & dmask[None, :]
            kc = tl.load(KC + kv_base + tile, mask=kmask, other=0.0)
            vc = tl.load(VC + kv_base + tile, mask=kmask, other=0.0)
            s = tl.dot(qc, tl.trans(kc), input_precision=PRECISION) * sm_scale
            p = tl.math.exp2(s * 1.4426950408889634 - lse2[:, None])
            p = tl.where(present[None, :], p, 0.0)
            dp = tl.dot(do, tl.trans(vc), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds, kc, dq, input_precision=PRECISION)
        tl.store(DQC + q_rows[:, None] * D + offs_d[None, :], dq * sm_scale, mask=rmask[:, None] & dmask[None, :])
    else:
        cols = (pid - NQT) * BLOCK_KV + tl.arange(0, BLOCK_KV)
        cmask = cols < KVb
        present = tl.load(KV_SIZES + cols, mask=cmask, other=0) > 0
        tile = cols.to(tl.int64)[:, None] * D + offs_d[None, :]
        kmask = cmask[:, None] & dmask[None, :]
        kc = tl.load(KC + kv_base + tile, mask=kmask, other=0.0)
        vc = tl.load(VC + kv_base + tile, mask=kmask, other=0.0)
        dk = tl.zeros([BLOCK_KV, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_KV, BLOCK_D], dtype=tl.float32)
        for r0 in range(0, Qb, BLOCK_Q):
            qc, do, delta, lse2, rmask, q_rows = _q_tile(QC, DO, O, LSE, bh, r0, Qb, D, offs_d, dmask, BLOCK_Q)
            s = tl.dot(qc, tl.trans(kc), input_precision=PRECISION) * sm_scale
            p = tl.math.exp2(s * 1.4426950408889634 - lse2[:, None])
            p = tl.where(rmask[:, None] & present[None, :], p, 0.0)
            dv = tl.dot(tl.trans(p), do, dv, input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(vc), input_precision=PRECISION)
            ds = p * (dp - delta[:, None])
            dk = tl.dot(tl.trans(ds), qc, dk, input_precision=PRECISION)
        tl.store(DKC + kv_base + tile, dk * sm_scale, mask=kmask)
        tl.store(DVC + kv_base + tile, dv, mask=kmask)


def vsa_coarse_bwd(qc, kc, vc, kv_sizes, dout, out32, lse, dqc, dkc, dvc, *, sm_scale: float,
                   precision: str = "ieee") -> None:
    """Gradients of the coarse attention into caller-allocated fp32 ``dqc``/``dkc``/``dvc``
    (contiguous, the shapes of ``qc``/``kc``/``vc``). ``dout``: contiguous ``[B,H,Qb,D]``, any float
    dtype; ``out32``: the forward's fp32 ``out_c``; ``lse``: its fp32 ``[B,H,Qb]`` natural-log LSE.
    ``precision``: one of ``vsa_select.COARSE_PRECISIONS`` (the forward's, to recompute its P)."""
    assert precision in COARSE_PRECISIONS, f"precision {precision!r}"
    B, H, Qb, D = qc.shape
    KVb = kc.shape[2]
    for name, x, shape in (("qc", qc, (B, H, Qb, D)), ("kc", kc, (B, H, KVb, D)), ("vc", vc, (B, H, KVb, D)),
                           ("out32", out32, (B, H, Qb, D)), ("dqc", dqc, (B, H, Qb, D)),
                           ("dkc", dkc, (B, H, KVb, D)), ("dvc", dvc, (B, H, KVb, D))):
        assert dtype_name(x) == "float32" and x.is_contiguous() and tuple(x.shape) == shape, f"{name}"
    assert dout.is_contiguous() and tuple(dout.shape) == (B, H, Qb, D), "dout"
    assert dtype_name(lse) == "float32" and lse.is_contiguous() and tuple(lse.shape) == (B, H, Qb), "lse"
    assert dtype_name(kv_sizes) == "int32" and kv_sizes.is_contiguous() and kv_sizes.numel() == KVb
    block_q, block_kv, block_d, warps = coarse_tiles(D)
    nqt = triton.cdiv(Qb, block_q)
    _vsa_coarse_bwd_kernel[(nqt + triton.cdiv(KVb, block_kv), B * H)](
        qc, kc, vc, kv_sizes, dout, out32, lse, dqc, dkc, dvc,
        Qb, KVb, D, nqt,
        float(sm_scale),
        BLOCK_Q=block_q, BLOCK_KV=block_kv, BLOCK_D=block_d, PRECISION=precision,
        num_warps=warps,
    )
