"""Fused VSA gate composition: ``out = out_s + gate * out_c`` (or ``out_s + out_c``), and its backward.

``out_c [B, H, Qb, D]`` holds one row per q block; it is broadcast to every token of its block
(padding tokens included, as the contract says). fp32 arithmetic, one rounding to ``out``'s dtype.

- Forward ``_vsa_gate_fwd_kernel``, grid ``(S / BLOCK_T, B * H)``: a ``BLOCK_T``-token tile (inside
  one q block) reads ``out_s`` and ``gate``, the block's ``out_c`` row once, writes ``out``
  (``config=``: other tile sizes, several whole q blocks per program, warps, a cache hint; the
  same per-element expression, so the same bits).
- Backward ``_vsa_gate_bwd_kernel``, grid ``(Qb, B * H)``: one program per q block walks its tokens
  in ``BLOCK_T`` chunks, writes ``d_gate = dout * out_c`` (with a gate) and sums
  ``dout * gate`` (or ``dout``) over the block's tokens in fp32 into ``d_out_c``: one program per
  output row, chunks in token order, so the sum is deterministic (no atomics). ``d_out_s`` is
  ``dout`` itself (the caller passes it through; nothing is written for it).

Tensors are BHSD views with any strides (last stride 1): a BSHD tensor is passed as its
``transpose(1, 2)`` view, no copy. Any head_dim. The launch helpers write into caller-allocated
tensors on the current CUDA device. This module does not import torch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .vsa_common import check_bhsd, token_tile

__all__ = ["vsa_gate_fwd", "vsa_gate_bwd"]


@triton.jit
def _vsa_gate_fwd_kernel(
    OS, OC, G, OUT,
    stride_sb, stride_sh, stride_ss,
    stride_cb, stride_ch, stride_cn,
    stride_gb, stride_gh, stride_gs,
    stride_ob, stride_oh, stride_os,
    H, D,
    BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_GATE: tl.constexpr,
    NB: tl.constexpr,
    EVICT: tl.constexpr,
):
    """``NB == 1``: a ``BLOCK_T``-token tile inside one q block (``BLOCK_T`` divides ``BLOCK``).
    ``NB > 1``: ``NB`` whole q blocks per program (``BLOCK_T = BLOCK``), a ``[NB, BLOCK, BLOCK_D]``
    tile. The same per-element expression either way, so the same bits."""
    pid_t = tl.program_id(0)
    bh = tl.program_id(1)
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    if NB == 1:
        tok = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
        n = (pid_t * BLOCK_T) // BLOCK
        m2 = (tok >= 0)[:, None] & dmask[None, :]
        oc = tl.load(OC + off_b * stride_cb + off_h * stride_ch + n.to(tl.int64) * stride_cn + offs_d,
                     mask=dmask, other=0.0).to(tl.float32)
        os_ = tl.load(OS + off_b * stride_sb + off_h * stride_sh + tok[:, None] * stride_ss + offs_d[None, :],
                      mask=m2, other=0.0, eviction_policy=EVICT).to(tl.float32)
        if HAS_GATE:
            g = tl.load(G + off_b * stride_gb + off_h * stride_gh + tok[:, None] * stride_gs + offs_d[None, :],
                        mask=m2, other=0.0, eviction_policy=EVICT).to(tl.float32)
            out = os_ + g * oc[None, :]
        else:
            out = os_ + oc[None, :]
        tl.store(OUT + off_b * stride_ob + off_h * stride_oh + tok[:, None] * stride_os + offs_d[None, :],
                 out.to(OUT.dtype.element_ty), mask=m2)
    else:
        nb = (pid_t * NB + tl.arange(0, NB)).to(tl.int64)  # q blocks of this program
        tok = nb[:, None, None] * BLOCK + tl.arange(0, BLOCK).to(tl.int64)[None, :, None]
        d3 = offs_d[None, None, :]
        m3 = (tok >= 0) & (d3 < D)
        oc = tl.load(OC + off_b * stride_cb + off_h * stride_ch + nb[:, None, None] * stride_cn + d3,
                     mask=(nb[:, None, None] >= 0) & (d3 < D), other=0.0).to(tl.float32)
        os_ = tl.load(OS + off_b * stride_sb + off_h * stride_sh + tok * stride_ss + d3,
                      mask=m3, other=0.0, eviction_policy=EVICT).to(tl.float32)
        if HAS_GATE:
            g = tl.load(G + off_b * stride_gb + off_h * stride_gh + tok * stride_gs + d3,
                        mask=m3, other=0.0, eviction_policy=EVICT).to(tl.float32)
            out = os_ + g * oc
        else:
            out = os_ + oc
        tl.store(OUT + off_b * stride_ob + off_h * stride_oh + tok * stride_os + d3,
                 out.to(OUT.dtype.element_ty), mask=m3)


@triton.jit
def _vsa_gate_bwd_kernel(
    DOUT, OC, G, DG, DOC,
    stride_db, stride_dh, stride_ds,
    stride_cb, stride_ch, stride_cn,
    stride_gb, stride_gh, stride_gs,
    stride_eb, stride_eh, stride_es,
    stride_fb, stride_fh, stride_fn,
    H, D,
    BLOCK: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_GATE: tl.constexpr,
    WRITE_DGATE: tl.constexpr,
):
    n = tl.program_id(0).to(tl.int64)
    bh = tl.program_id(1)
    off_b = (bh // H).to(tl.int64)
    off_h = (bh % H).to(tl.int64)
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    m2 = (offs_t >= 0)[:, None] & dmask[None, :]
    if WRITE_DGATE:
        oc = tl.load(OC + off_b * stride_cb + off_h * stride_ch + n * stride_cn + offs_d,
                     mask=dmask, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for t0 in range(0, BLOCK, BLOCK_T):
        tok = n * BLOCK + t0 + offs_t
        do = tl.load(DOUT + off_b * stride_db + off_h * stride_dh + tok[:, None] * stride_ds + offs_d[None, :],
                     mask=m2, other=0.0).to(tl.float32)
        if HAS_GATE:
            g = tl.load(G + off_b * stride_gb + off_h * stride_gh + tok[:, None] * stride_gs + offs_d[None, :],
                        mask=m2, other=0.0).to(tl.float32)
            if WRITE_DGATE:
                tl.store(DG + off_b * stride_eb + off_h * stride_eh + tok[:, None] * stride_es + offs_d[None, :],
                         (do * oc[None, :]).to(DG.dtype.element_ty), mask=m2)
            acc += tl.sum(do * g, axis=0)
        else:
            acc += tl.sum(do, axis=0)
    tl.store(DOC + off_b * stride_fb + off_h * stride_fh + n * stride_fn + offs_d,
             acc.to(DOC.dtype.element_ty), mask=dmask)


def _s3(x):
    return (x.stride(0), x.stride(1), x.stride(2))


def _fwd_config(config, block, head_dim, S):
    """(BLOCK_T, BLOCK_D, NB, num_warps, eviction policy): ``config`` is None (today's tile) or a
    dict with any of ``block_t`` (tokens per program: a power of two dividing ``block``, or a
    multiple of it dividing ``S``), ``num_warps``, ``evict_first``."""
    block_t, block_d = token_tile(block, head_dim)
    if config is None:
        return block_t, block_d, 1, 4, ""
    cfg = dict(config)
    unknown = set(cfg) - {"block_t", "num_warps", "evict_first"}
    if unknown:
        raise ValueError(f"config: unknown keys {sorted(unknown)}")
    block_t = int(cfg.get("block_t", block_t))
    warps = int(cfg.get("num_warps", 4))
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"config: num_warps={warps} must be one of 1, 2, 4, 8, 16")
    evict = "evict_first" if cfg.get("evict_first") else ""
    if block_t <= block:
        if block_t < 1 or block_t & (block_t - 1) or block % block_t:
            raise ValueError(f"config: block_t={block_t} must be a power of two dividing block {block}")
        return block_t, block_d, 1, warps, evict
    nb = block_t // block
    if block_t % block or nb & (nb - 1) or block & (block - 1) or S % block_t:
        raise ValueError(f"config: block_t={block_t} must be a power-of-two multiple of block {block} dividing {S}")
    return block, block_d, nb, warps, evict


def vsa_gate_fwd(out_s, out_c, gate, out, *, block: int, config=None) -> None:
    """``out = out_s + gate * out_c[block of token]`` (``gate=None``: ``out_s + out_c``).
    ``out_s``/``gate``/``out``: BHSD ``[B,H,S,D]`` views; ``out_c``: ``[B,H,S/block,D]`` view.
    ``config``: tuning (see ``_fwd_config``; every config gives the same bits: one expression per
    element)."""
    B, H, S, D = check_bhsd("out_s", out_s)
    assert S % block == 0, "length must be a multiple of block"
    check_bhsd("out", out, B, H, S, D)
    check_bhsd("out_c", out_c, B, H, S // block, D)
    if gate is not None:
        check_bhsd("gate", gate, B, H, S, D)
    block_t, block_d, nb, warps, evict = _fwd_config(config, block, D, S)
    g = gate if gate is not None else out_s
    _vsa_gate_fwd_kernel[(S // (block_t * nb), B * H)](
        out_s, out_c, g, out,
        *_s3(out_s), *_s3(out_c), *_s3(g), *_s3(out),
        H, D,
        BLOCK=block, BLOCK_T=block_t, BLOCK_D=block_d, HAS_GATE=gate is not None, NB=nb, EVICT=evict,
        num_warps=warps,
    )


def vsa_gate_bwd(dout, out_c, gate, d_gate, d_out_c, *, block: int) -> None:
    """``d_out_c[n] = sum over block n's tokens of dout * gate`` (or of ``dout`` when ``gate`` is
    None), fp32 sums rounded once to ``d_out_c``'s dtype (a ``[B,H,S/block,D]`` view), and, when
    ``d_gate`` is given (a BHSD view like ``dout``; needs ``gate``), ``d_gate = dout * out_c``."""
    B, H, S, D = check_bhsd("dout", dout)
    assert S % block == 0, "length must be a multiple of block"
    check_bhsd("out_c", out_c, B, H, S // block, D)
    check_bhsd("d_out_c", d_out_c, B, H, S // block, D)
    if gate is not None:
        check_bhsd("gate", gate, B, H, S, D)
    if d_gate is not None:
        assert gate is not None, "d_gate needs the gate"
        check_bhsd("d_gate", d_gate, B, H, S, D)
    g = gate if gate is not None else dout
    dg = d_gate if d_gate is not None else dout
    block_t, block_d = token_tile(block, D)
    _vsa_gate_bwd_kernel[(S // block, B * H)](
        dout, out_c, g, dg, d_out_c,
        *_s3(dout), *_s3(out_c), *_s3(g), *_s3(dg), *_s3(d_out_c),
        H, D,
        BLOCK=block, BLOCK_T=block_t, BLOCK_D=block_d, HAS_GATE=gate is not None,
        WRITE_DGATE=d_gate is not None,
        num_warps=4,
    )
