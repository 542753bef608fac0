"""Triton block-sparse attention backward (FlashAttention-2 style, deterministic).

Three kernels, no atomics (every output element is written by exactly one program):

1. ``_bsa_bwd_preprocess``: ``delta = rowsum(out * dout)`` in fp32, ``[B, H, Sq]``.
2. ``_bsa_bwd_dq_kernel``: one program per ``BLOCK_M`` query rows; walks the q block's kv list
   (q2k) in ``BLOCK_N`` key tiles; ``dq = sm_scale * sum_j dS_j K_j``.
   Grid ``(Sq // BLOCK_M, B * H)``.
3. ``_bsa_bwd_dkdv_kernel``: one program per ``BLOCK_N`` key rows; walks the kv block's q list
   (k2q) in ``BLOCK_M`` query tiles; ``dv = sum P^T dO``, ``dk = sm_scale * sum dS^T Q``.
   Grid ``(Skv // BLOCK_N, B * H)``. Rows of padding keys (and of kv blocks nobody selected)
   are written as exact zeros.

``P`` is recomputed from the forward's natural-log lse (converted to log2 inside); rows with
lse = -inf (no valid key) use +inf instead so ``P = 0`` there and nothing turns NaN.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import triton
import triton.language as tl

from ._common import LOG2E, check_last_stride, check_meta, input_precision, resolve_config

__all__ = ["block_sparse_attn_bwd"]


@triton.jit
def _bsa_bwd_preprocess(
    Out, DOut, Delta,
    stride_ob, stride_oh, stride_om,
    stride_dob, stride_doh, stride_dom,
    H, Sq,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    o = tl.load(Out + off_b * stride_ob + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :])
    do = tl.load(DOut + off_b * stride_dob + off_h * stride_doh + offs_m[:, None] * stride_dom + offs_d[None, :])
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(Delta + pid_bh.to(tl.int64) * Sq + offs_m, delta)


@triton.jit
def _bsa_bwd_dq_kernel(
    Q, K, V, DOut, DQ, Lse, Delta,
    Q2K_IDX, Q2K_NUM, KV_SIZES,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom,
    stride_dqb, stride_dqh, stride_dqm,
    H, Sq, Qb, W,
    sm_scale,
    qk_scale,  # sm_scale * log2(e)
    Q_BLOCK: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    SUB: tl.constexpr = KV_BLOCK // BLOCK_N
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    q_blk = (pid_m * BLOCK_M) // Q_BLOCK

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_m64 = offs_m.to(tl.int64)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    q = tl.load(Q + off_b * stride_qb + off_h * stride_qh + offs_m64[:, None] * stride_qm + offs_d[None, :])
    do = tl.load(DOut + off_b * stride_dob + off_h * stride_doh + offs_m64[:, None] * stride_dom + offs_d[None, :])
    row_meta = pid_bh.to(tl.int64) * Sq + offs_m
    lse = tl.load(Lse + row_meta)
    delta = tl.load(Delta + row_meta)
    no_key = lse == float("-inf")
    lse2 = tl.where(no_key, float("inf"), lse * 1.4426950408889634)

    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    k_tile = offs_n[:, None] * stride_kn + offs_d[None, :]
    v_tile = offs_n[:, None] * stride_vn + offs_d[None, :]

    meta_row = pid_bh * Qb + q_blk
    num = tl.load(Q2K_NUM + meta_row)
    idx_ptr = Q2K_IDX + meta_row.to(tl.int64) * W

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for it in range(0, num * SUB):
        blk = tl.load(idx_ptr + it // SUB)
        sub = it % SUB
        size = tl.load(KV_SIZES + blk)
        key0 = sub * BLOCK_N
        kvalid = (key0 + offs_n) < size
        row0 = (blk * KV_BLOCK + key0).to(tl.int64)
        k = tl.load(k_base + row0 * stride_kn + k_tile, mask=kvalid[:, None], other=0.0)
        v = tl.load(v_base + row0 * stride_vn + v_tile, mask=kvalid[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        p = tl.where(kvalid[None, :], p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)

    dq = tl.where(no_key[:, None], 0.0, dq * sm_scale)
    tl.store(DQ + off_b * stride_dqb + off_h * stride_dqh + offs_m64[:, None] * stride_dqm + offs_d[None, :],
             dq.to(DQ.dtype.element_ty))


@triton.jit
def _bsa_bwd_dkdv_kernel(
    Q, K, V, DOut, DK, DV, Lse, Delta,
    K2Q_IDX, K2Q_NUM, KV_SIZES,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom,
    stride_dkb, stride_dkh, stride_dkn,
    stride_dvb, stride_dvh, stride_dvn,
    H, Sq, KVb, W,
    sm_scale,
    qk_scale,  # sm_scale * log2(e)
    Q_BLOCK: tl.constexpr,
    KV_BLOCK: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    SUB: tl.constexpr = Q_BLOCK // BLOCK_M
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // H).to(tl.int64)
    off_h = (pid_bh % H).to(tl.int64)
    kv_blk = (pid_n * BLOCK_N) // KV_BLOCK

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n64 = offs_n.to(tl.int64)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)

    size = tl.load(KV_SIZES + kv_blk)
    kvalid = (offs_n - kv_blk * KV_BLOCK) < size
    k = tl.load(K + off_b * stride_kb + off_h * stride_kh + offs_n64[:, None] * stride_kn + offs_d[None, :],
                mask=kvalid[:, None], other=0.0)
    v = tl.load(V + off_b * stride_vb + off_h * stride_vh + offs_n64[:, None] * stride_vn + offs_d[None, :],
                mask=kvalid[:, None], other=0.0)

    q_base = Q + off_b * stride_qb + off_h * stride_qh
    do_base = DOut + off_b * stride_dob + off_h * stride_doh
    q_tile = offs_m[:, None] * stride_qm + offs_d[None, :]
    do_tile = offs_m[:, None] * stride_dom + offs_d[None, :]
    lse_base = Lse + pid_bh.to(tl.int64) * Sq
    delta_base = Delta + pid_bh.to(tl.int64) * Sq

    meta_row = pid_bh * KVb + kv_blk
    # A tile entirely past the valid keys contributes nothing: skip its list.
    num = tl.load(K2Q_NUM + meta_row)
    num = tl.where(pid_n * BLOCK_N - kv_blk * KV_BLOCK < size, num, 0)
    idx_ptr = K2Q_IDX + meta_row.to(tl.int64) * W

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for it in range(0, num * SUB):
        qblk = tl.load(idx_ptr + it // SUB)
        sub = it % SUB
        row0 = qblk * Q_BLOCK + sub * BLOCK_M
        q = tl.load(q_base + row0.to(tl.int64) * stride_qm + q_tile)
        do = tl.load(do_base + row0.to(tl.int64) * stride_dom + do_tile)
        lse = tl.load(lse_base + row0 + offs_m)
        delta = tl.load(delta_base + row0 + offs_m)
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
        qkT = tl.dot(k, tl.trans(q), input_precision=PRECISION)
        # Padding-key rows of pT hold garbage (k was loaded as 0) but rows of dk/dv only
        # depend on their own row of pT/dsT, and those rows are zeroed at the store.
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=PRECISION)
        dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=PRECISION)

    dk = tl.where(kvalid[:, None], dk * sm_scale, 0.0)
    dv = tl.where(kvalid[:, None], dv, 0.0)
    tl.store(DK + off_b * stride_dkb + off_h * stride_dkh + offs_n64[:, None] * stride_dkn + offs_d[None, :],
             dk.to(DK.dtype.element_ty))
    tl.store(DV + off_b * stride_dvb + off_h * stride_dvh + offs_n64[:, None] * stride_dvn + offs_d[None, :],
             dv.to(DV.dtype.element_ty))


def block_sparse_attn_bwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    q2k_idx: torch.Tensor,
    q2k_num: torch.Tensor,
    k2q_idx: torch.Tensor,
    k2q_num: torch.Tensor,
    kv_block_sizes: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    *,
    sm_scale: float,
    q_block: int,
    kv_block: int,
    config: Optional[Dict[str, Any]] = None,
) -> None:
    """Block-sparse attention backward into caller-allocated dq/dk/dv (any strides, last 1).

    ``lse`` is the forward's natural-log lse ([B,H,Sq] fp32 contiguous). Deterministic.
    """
    B, H, Sq, D = q.shape
    Skv = k.shape[2]
    assert Sq % q_block == 0 and Skv % kv_block == 0
    assert D in (16, 32, 64, 128, 256), "head dim must be a power of two"
    assert sm_scale > 0
    check_last_stride(q, k, v, out, dout, dq, dk, dv)
    assert lse.dtype == torch.float32 and lse.is_contiguous() and tuple(lse.shape) == (B, H, Sq)
    Qb, KVb = Sq // q_block, Skv // kv_block
    check_meta(q2k_idx, q2k_num, B, H, Qb)
    check_meta(k2q_idx, k2q_num, B, H, KVb)
    assert kv_block_sizes.dtype == torch.int32 and kv_block_sizes.numel() == KVb
    cfg = resolve_config(config, D, q.dtype, q_block, kv_block)
    delta = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    _launch_preprocess(out, dout, delta, cfg["bwd_pre"])
    args = (q, k, v, dout, lse, delta, q2k_idx, q2k_num, k2q_idx, k2q_num, kv_block_sizes)
    _launch_dkdv(*args, dk, dv, sm_scale=sm_scale, q_block=q_block, kv_block=kv_block, cfg=cfg)
    _launch_dq(*args, dq, sm_scale=sm_scale, q_block=q_block, kv_block=kv_block, cfg=cfg)


def _launch_preprocess(out, dout, delta, c):
    B, H, Sq, D = out.shape
    _bsa_bwd_preprocess[(Sq // c["BLOCK_M"], B * H)](
        out, dout, delta,
        out.stride(0), out.stride(1), out.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        H, Sq,
        HEAD_DIM=D, BLOCK_M=c["BLOCK_M"], num_warps=c["num_warps"],
    )


def _launch_dkdv(q, k, v, dout, lse, delta, q2k_idx, q2k_num, k2q_idx, k2q_num, kv_block_sizes, dk, dv, *,
                 sm_scale, q_block, kv_block, cfg):
    B, H, Sq, D = q.shape
    Skv = k.shape[2]
    c = cfg["bwd_dkdv"]
    _bsa_bwd_dkdv_kernel[(Skv // c["BLOCK_N"], B * H)](
        q, k, v, dout, dk, dv, lse, delta,
        k2q_idx, k2q_num, kv_block_sizes,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        H, Sq, Skv // kv_block, k2q_idx.shape[-1],
        float(sm_scale), float(sm_scale) * LOG2E,
        Q_BLOCK=q_block, KV_BLOCK=kv_block, HEAD_DIM=D,
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], PRECISION=input_precision(q.dtype, cfg),
        num_warps=c["num_warps"], num_stages=c["num_stages"],
    )


def _launch_dq(q, k, v, dout, lse, delta, q2k_idx, q2k_num, k2q_idx, k2q_num, kv_block_sizes, dq, *,
               sm_scale, q_block, kv_block, cfg):
    B, H, Sq, D = q.shape
    c = cfg["bwd_dq"]
    _bsa_bwd_dq_kernel[(Sq // c["BLOCK_M"], B * H)](
        q, k, v, dout, dq, lse, delta,
        q2k_idx, q2k_num, kv_block_sizes,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        H, Sq, Sq // q_block, q2k_idx.shape[-1],
        float(sm_scale), float(sm_scale) * LOG2E,
        Q_BLOCK=q_block, KV_BLOCK=kv_block, HEAD_DIM=D,
        BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], PRECISION=input_precision(q.dtype, cfg),
        num_warps=c["num_warps"], num_stages=c["num_stages"],
    )
