"""Triton block-sparse attention forward (FlashAttention-2 style online softmax).

One program per ``BLOCK_M`` query rows (a tile inside one q block) of one (batch, head);
it walks that q block's kv list (``q2k_idx``/``q2k_num``) in ``BLOCK_N`` key tiles.
Grid: ``(Sq // BLOCK_M, B * H)`` -- q tiles fastest.

Numerics: fp32 accumulation; scores in the log2 domain (``sm_scale * log2(e)`` folded into
one FMA before ``exp2``); keys at or past ``kv_block_sizes[j]`` are never loaded (masked
loads, ``other=0``) and get score ``-inf``; rows with no valid key give out 0, lse -inf.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import triton
import triton.language as tl

from ._common import LOG2E, check_last_stride, check_meta, input_precision, resolve_config

__all__ = ["block_sparse_attn_fwd"]


@triton.jit
def _bsa_fwd_kernel(
    Q, K, V, Out, Lse,
    Q2K_IDX, Q2K_NUM, KV_SIZES,
    stride_qb, stride_qh, stride_qm,
    stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    H, Sq, Qb, W,
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
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)

    q_ptrs = Q + off_b * stride_qb + off_h * stride_qh + offs_m.to(tl.int64)[:, None] * stride_qm + offs_d[None, :]
    q = tl.load(q_ptrs)

    k_base = K + off_b * stride_kb + off_h * stride_kh
    v_base = V + off_b * stride_vb + off_h * stride_vh
    k_tile = offs_n[:, None] * stride_kn + offs_d[None, :]
    v_tile = offs_n[:, None] * stride_vn + offs_d[None, :]

    meta_row = pid_bh * Qb + q_blk
    num = tl.load(Q2K_NUM + meta_row)
    idx_ptr = Q2K_IDX + meta_row.to(tl.int64) * W

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    for it in range(0, num * SUB):
        blk = tl.load(idx_ptr + it // SUB)
        sub = it % SUB
        size = tl.load(KV_SIZES + blk)
        key0 = sub * BLOCK_N
        kvalid = (key0 + offs_n) < size
        row0 = (blk * KV_BLOCK + key0).to(tl.int64)
        k = tl.load(k_base + row0 * stride_kn + k_tile, mask=kvalid[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        qk = tl.where(kvalid[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        # Guard: a row whose keys so far are all masked keeps m = -inf; subtract 0 instead.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk * qk_scale - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + row0 * stride_vn + v_tile, mask=kvalid[:, None], other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new

    # l == 0: no valid key (out 0, lse -inf). A NaN l (NaN in a valid row) must stay NaN in out and lse.
    has_key = l_i != 0.0
    inv_l = tl.where(has_key, 1.0 / tl.where(has_key, l_i, 1.0), 0.0)
    out = acc * inv_l[:, None]
    # natural-log lse = ln2 * (m + log2 l); -inf where the row has no valid key
    lse = tl.where(has_key, (m_i + tl.math.log2(tl.where(has_key, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    o_ptrs = Out + off_b * stride_ob + off_h * stride_oh + offs_m.to(tl.int64)[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty))
    tl.store(Lse + pid_bh.to(tl.int64) * Sq + offs_m, lse)


def block_sparse_attn_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q2k_idx: torch.Tensor,
    q2k_num: torch.Tensor,
    kv_block_sizes: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    *,
    sm_scale: float,
    q_block: int,
    kv_block: int,
    config: Optional[Dict[str, Any]] = None,
) -> None:
    """Block-sparse attention forward into caller-allocated ``out`` ([B,H,Sq,D]) and ``lse``
    ([B,H,Sq] fp32 contiguous, natural log). q/k/v/out may have any strides with last stride 1."""
    B, H, Sq, D = q.shape
    Skv = k.shape[2]
    assert Sq % q_block == 0 and Skv % kv_block == 0
    assert D in (16, 32, 64, 128, 256), "head dim must be a power of two"
    assert sm_scale > 0
    check_last_stride(q, k, v, out)
    assert lse.dtype == torch.float32 and lse.is_contiguous() and tuple(lse.shape) == (B, H, Sq)
    Qb = Sq // q_block
    check_meta(q2k_idx, q2k_num, B, H, Qb)
    assert kv_block_sizes.dtype == torch.int32 and kv_block_sizes.numel() == Skv // kv_block
    cfg = resolve_config(config, D, q.dtype, q_block, kv_block, flat_section="fwd")
    c = cfg["fwd"]
    grid = (Sq // c["BLOCK_M"], B * H)
    _bsa_fwd_kernel[grid](
        q, k, v, out, lse,
        q2k_idx, q2k_num, kv_block_sizes,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        H, Sq, Qb, q2k_idx.shape[-1],
        float(sm_scale) * LOG2E,
        Q_BLOCK=q_block,
        KV_BLOCK=kv_block,
        HEAD_DIM=D,
        BLOCK_M=c["BLOCK_M"],
        BLOCK_N=c["BLOCK_N"],
        PRECISION=input_precision(q.dtype, cfg),
        num_warps=c["num_warps"],
        num_stages=c["num_stages"],
    )
