"""Backward of VSA's coarse attention (``out_c = softmax(qc kc^T * sm_scale) vc``): two phases.

Inputs: the forward's ``qc``/``kc``/``vc`` (fp32 ``[B, H, n, D]``), ``kv_sizes`` (kv blocks of
size 0 were ``-inf`` columns), ``dout`` (``d out_c``, any float dtype, ``[B, H, Qb, D]``), the
forward's fp32 ``out_c`` and its natural-log row LSE. ``P`` is recomputed from the LSE
(``P = exp(s - lse)``), so no ``[Qb, KVb]`` tensor is kept between forward and backward; a row with
LSE ``-inf`` (every kv block empty) uses ``+inf`` so its ``P`` is 0 and nothing turns NaN; an
empty kv block's column of ``P`` is 0.

Why two phases. The one-launch design (still here as the fallback, see below) had q-side and
kv-side programs both recompute ``S`` and ``P``; the kv-side programs ran four dependent dots and
an ``exp`` per q chunk over every q chunk and were the long pole (H200, B=1, H=12, Qb=KVb=624,
D=128, tf32x3: ~405-450 us against ~78 us for the forward over the same sizes). Here ``S``/``P``
are computed once, by the q side, and handed to the kv side through two fp32 scratch tensors:

- **Phase A** ``_coarse_bwd_q_kernel``, grid ``(cdiv(Qb, BLOCK_Q), B * H)``: a ``BLOCK_Q`` tile of
  q blocks (``qc``, ``dout``, ``delta = rowsum(dout * out_c)``, the LSE) walks every kv chunk:
  ``s = qc kc^T * sm_scale``, ``p = exp(s - lse)`` (0 at empty kv blocks / ``-inf`` rows),
  ``dp = dout vc^T``, ``ds = p * (dp - delta)``; accumulates ``dqc = sm_scale * sum_j ds_j kc_j``
  and stores ``p`` and ``ds`` into ``p_scratch`` / ``ds_scratch`` ``[B, H, Qb, KVb]`` (rows past
  ``Qb`` / columns past ``KVb`` are not stored). The forward's work plus one dot and two tile stores.
- **Phase B** ``_coarse_bwd_kv_kernel``, grid ``(cdiv(KVb, BLOCK_KV), B * H)``: a ``BLOCK_KV`` tile
  of kv blocks walks every q chunk, reading the stored tiles: ``dvc = sum_i p_i^T dout_i``,
  ``dkc = sm_scale * sum_i ds_i^T qc_i``. Two independent dots per chunk, no exp, no recompute.

The price is memory: ``2 * B * H * Qb * KVb * 4`` bytes of scratch during the call (37 MB at
Wan-1.3B 480p, H=12, 624 blocks; 446 MB at Wan-14B 720p, H=40, 1180 blocks), written once and
read once. The scratch is caller-allocated (this module allocates nothing); when the caller
passes none, the helper runs the one-launch **fused** kernel ``_vsa_coarse_bwd_kernel`` instead
(grid ``(cdiv(Qb, BLOCK_Q) + cdiv(KVb, BLOCK_KV), B * H)``: q-side programs as phase A without
the stores, kv-side programs recomputing ``S``/``P``/``dP`` per q chunk): slower, no scratch.

Tiles: :func:`coarse_bwd_tiles` gives ``(BLOCK_Q, BLOCK_KV, BLOCK_D, num_warps)`` per phase and
head_dim (swept on the H200 at head_dim 128); the helper's ``tiles=`` keyword overrides them.

Every output element (gradients and scratch) is written by one program, summed in a fixed order:
deterministic, no atomics. fp32 throughout; ``S = qc kc^T`` (from which P is recomputed against the
forward's LSE) uses ``input_precision=precision`` (``"ieee"`` by default), the four gradient
products ``grad_precision`` (default: ``precision``). Outputs are fp32 contiguous ``[B, H, n, D]``,
written into caller-allocated tensors on the current CUDA device. This module does not import torch.
"""

from __future__ import annotations

from typing import Tuple

import triton
import triton.language as tl

from .vsa_common import dtype_name, pow2_lanes
from .vsa_select import COARSE_PRECISIONS, coarse_tiles

__all__ = ["vsa_coarse_bwd", "coarse_bwd_tiles", "COARSE_BWD_PHASES"]

# "a": the q side (dqc, writes the scratch); "b": the kv side (dkc, dvc from the scratch);
# "fused": the one-launch kernel run when no scratch is given.
COARSE_BWD_PHASES = ("a", "b", "fused")
_TILE_KEYS = ("BLOCK_Q", "BLOCK_KV", "BLOCK_D", "num_warps", "num_stages")


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
def _p_ds(qc, do, delta, lse2, kc, vc, keep, sm_scale, PRECISION: tl.constexpr, GRAD_PRECISION: tl.constexpr):
    """One ``[BLOCK_Q, BLOCK_KV]`` tile of P (from the LSE; 0 where ``keep`` is false) and dS."""
    s = tl.dot(qc, tl.trans(kc), input_precision=PRECISION) * sm_scale
    p = tl.math.exp2(s * 1.4426950408889634 - lse2[:, None])
    p = tl.where(keep, p, 0.0)
    dp = tl.dot(do, tl.trans(vc), input_precision=GRAD_PRECISION)
    ds = p * (dp - delta[:, None])
    return p, ds


@triton.jit
def _kv_tile(KC, VC, KV_SIZES, kv_base, c0, KVb, D, offs_d, dmask, BLOCK_KV: tl.constexpr):
    """kv blocks ``c0 .. c0+BLOCK_KV`` of one (b, h): kc, vc, present (size > 0), column mask."""
    cols = c0 + tl.arange(0, BLOCK_KV)
    cmask = cols < KVb
    present = tl.load(KV_SIZES + cols, mask=cmask, other=0) > 0  # out-of-range columns: absent
    tile = cols.to(tl.int64)[:, None] * D + offs_d[None, :]
    kmask = cmask[:, None] & dmask[None, :]
    kc = tl.load(KC + kv_base + tile, mask=kmask, other=0.0)
    vc = tl.load(VC + kv_base + tile, mask=kmask, other=0.0)
    return kc, vc, present, cols, cmask, tile, kmask


@triton.jit
def _coarse_bwd_q_kernel(
    QC, KC, VC, KV_SIZES, DO, O, LSE, DQC, PS, DSS,
    Qb, KVb, D,
    sm_scale,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    GRAD_PRECISION: tl.constexpr,
):
    """Phase A: dqc of one q tile; p and ds of its rows into the scratch."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    kv_base = bh * KVb * D
    qc, do, delta, lse2, rmask, q_rows = _q_tile(QC, DO, O, LSE, bh, pid * BLOCK_Q, Qb, D, offs_d, dmask, BLOCK_Q)
    dq = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    for c0 in range(0, KVb, BLOCK_KV):
        kc, vc, present, cols, cmask, _, _ = _kv_tile(KC, VC, KV_SIZES, kv_base, c0, KVb, D, offs_d, dmask,
                                                      BLOCK_KV)
        p, ds = _p_ds(qc, do, delta, lse2, kc, vc, present[None, :], sm_scale, PRECISION, GRAD_PRECISION)
        s_ptrs = q_rows[:, None] * KVb + cols[None, :]
        smask = rmask[:, None] & cmask[None, :]
        tl.store(PS + s_ptrs, p, mask=smask)
        tl.store(DSS + s_ptrs, ds, mask=smask)
        dq = tl.dot(ds, kc, dq, input_precision=GRAD_PRECISION)
    tl.store(DQC + q_rows[:, None] * D + offs_d[None, :], dq * sm_scale, mask=rmask[:, None] & dmask[None, :])


@triton.jit
def _coarse_bwd_kv_kernel(
    QC, DO, PS, DSS, DKC, DVC,
    Qb, KVb, D,
    sm_scale,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GRAD_PRECISION: tl.constexpr,
):
    """Phase B: dkc and dvc of one kv tile from the stored p / ds tiles (q chunks in order)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    cols = pid * BLOCK_KV + tl.arange(0, BLOCK_KV)
    cmask = cols < KVb
    kv_base = bh * KVb * D
    tile = cols.to(tl.int64)[:, None] * D + offs_d[None, :]
    dk = tl.zeros([BLOCK_KV, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_KV, BLOCK_D], dtype=tl.float32)
    for r0 in range(0, Qb, BLOCK_Q):
        rows = r0 + tl.arange(0, BLOCK_Q)
        rmask = rows < Qb
        q_rows = bh * Qb + rows.to(tl.int64)
        ptrs = q_rows[:, None] * D + offs_d[None, :]
        m2 = rmask[:, None] & dmask[None, :]
        qc = tl.load(QC + ptrs, mask=m2, other=0.0)
        do = tl.load(DO + ptrs, mask=m2, other=0.0).to(tl.float32)
        s_ptrs = q_rows[:, None] * KVb + cols[None, :]
        smask = rmask[:, None] & cmask[None, :]
        p = tl.load(PS + s_ptrs, mask=smask, other=0.0)
        ds = tl.load(DSS + s_ptrs, mask=smask, other=0.0)
        dv = tl.dot(tl.trans(p), do, dv, input_precision=GRAD_PRECISION)
        dk = tl.dot(tl.trans(ds), qc, dk, input_precision=GRAD_PRECISION)
    kmask = cmask[:, None] & dmask[None, :]
    tl.store(DKC + kv_base + tile, dk * sm_scale, mask=kmask)
    tl.store(DVC + kv_base + tile, dv, mask=kmask)


@triton.jit
def _vsa_coarse_bwd_kernel(
    QC, KC, VC, KV_SIZES, DO, O, LSE, DQC, DKC, DVC,
    Qb, KVb, D, NQT,
    sm_scale,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
    GRAD_PRECISION: tl.constexpr,
):
    """The fused fallback (no scratch): q-side programs ``pid < NQT``, then kv-side programs."""
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
            # distinct names: Triton types every loop-carried name once (a reused `_` broke the GPU build)
            kc, vc, present, _c0, _m0, _t0, _k0 = _kv_tile(KC, VC, KV_SIZES, kv_base, c0, KVb, D, offs_d, dmask,
                                                           BLOCK_KV)
            p, ds = _p_ds(qc, do, delta, lse2, kc, vc, present[None, :], sm_scale, PRECISION, GRAD_PRECISION)
            dq = tl.dot(ds, kc, dq, input_precision=GRAD_PRECISION)
        tl.store(DQC + q_rows[:, None] * D + offs_d[None, :], dq * sm_scale, mask=rmask[:, None] & dmask[None, :])
    else:
        kc, vc, present, _cols, _cmask, tile, kmask = _kv_tile(KC, VC, KV_SIZES, kv_base, (pid - NQT) * BLOCK_KV,
                                                               KVb, D, offs_d, dmask, BLOCK_KV)
        dk = tl.zeros([BLOCK_KV, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_KV, BLOCK_D], dtype=tl.float32)
        for r0 in range(0, Qb, BLOCK_Q):
            qc, do, delta, lse2, rmask, _rows = _q_tile(QC, DO, O, LSE, bh, r0, Qb, D, offs_d, dmask, BLOCK_Q)
            p, ds = _p_ds(qc, do, delta, lse2, kc, vc, rmask[:, None] & present[None, :], sm_scale, PRECISION,
                          GRAD_PRECISION)
            dv = tl.dot(tl.trans(p), do, dv, input_precision=GRAD_PRECISION)
            dk = tl.dot(tl.trans(ds), qc, dk, input_precision=GRAD_PRECISION)
        tl.store(DKC + kv_base + tile, dk * sm_scale, mask=kmask)
        tl.store(DVC + kv_base + tile, dv, mask=kmask)


def coarse_bwd_tiles(phase: str, head_dim: int) -> Tuple[int, int, int, int]:
    """Default ``(BLOCK_Q, BLOCK_KV, BLOCK_D, num_warps)`` of one backward phase (``"a"``, ``"b"``
    or ``"fused"``) at ``head_dim``. Swept on the H200 at head_dim 128 (``benchmarks/bench_glue.py
    --kernels coarsebwd``, ``benchmarks/results/glue_h200_v8.json`` / ``_v9.json``): with TF32
    gradient products these defaults were the fastest of ten tilings; with tf32x3 throughout phase
    a gained 6 % from two pipeline stages (the ``tiles=`` keyword of :func:`vsa_coarse_bwd`).

    - ``"a"``: the forward's work plus one dot, so the forward's shape class: 32x32, 4 warps up
      to head_dim 128 (Wan-1.3B 480p: 20 x 12 = 240 programs on 132 SMs); 16x16 at 256 (qc,
      dout, dq and two kv tiles of 256 fp32 lanes each live per program, kv loads multi-buffered
      in shared memory: 16-row tiles keep that well under Hopper's ~227 KB).
    - ``"b"``: per q chunk loads qc/dout ``[BLOCK_Q, BLOCK_D]`` and two ``[BLOCK_Q, BLOCK_KV]``
      scratch tiles, accumulates dk/dv ``[BLOCK_KV, BLOCK_D]``: 32x32, 4 warps up to 128 (~40 KB
      of loads per pipeline stage); at 256 16-row q chunks and 8 warps (two 32x256 fp32
      accumulators: 64 registers a thread).
    - ``"fused"``: the fallback's historical tiles, :func:`vsa_select.coarse_tiles`.
    """
    assert phase in COARSE_BWD_PHASES, f"phase {phase!r}"
    block_d = pow2_lanes(head_dim, 16)
    if phase == "fused":
        return coarse_tiles(head_dim)
    if phase == "a":
        return (32, 32, block_d, 4) if block_d <= 128 else (16, 16, block_d, 4)
    return (32, 32, block_d, 4) if block_d <= 128 else (16, 32, block_d, 8)


def _is_pow2(x) -> bool:
    return isinstance(x, int) and x > 0 and (x & (x - 1)) == 0


def _phase_config(tiles, phase: str, head_dim: int) -> dict:
    """The default tiles of ``phase`` with ``tiles``' entry for it (if any) laid over them.

    ``tiles``: ``None``; a dict ``{"a": cfg, "b": cfg, "fused": cfg}`` (keys optional); or a
    sequence ``(cfg_a, cfg_b)`` / ``(cfg_a, cfg_b, cfg_fused)``. A ``cfg`` is ``None`` (the
    default), a tuple ``(BLOCK_Q, BLOCK_KV, BLOCK_D, num_warps[, num_stages])`` (``BLOCK_D`` may be
    ``None``: the default for head_dim) or a dict with any of ``BLOCK_Q``, ``BLOCK_KV``,
    ``BLOCK_D``, ``num_warps``, ``num_stages`` (``None``: Triton's default)."""
    cfg = dict(zip(_TILE_KEYS, coarse_bwd_tiles(phase, head_dim) + (None,)))
    over = None
    if tiles is not None:
        if isinstance(tiles, dict):
            bad = set(tiles) - set(COARSE_BWD_PHASES)
            assert not bad, f"tiles: unknown phase(s) {sorted(bad)}"
            over = tiles.get(phase)
        else:
            tiles = tuple(tiles)
            assert len(tiles) in (2, 3), "tiles: (cfg_a, cfg_b[, cfg_fused])"
            i = COARSE_BWD_PHASES.index(phase)
            over = tiles[i] if i < len(tiles) else None
    if over is not None:
        if isinstance(over, dict):
            bad = set(over) - set(_TILE_KEYS)
            assert not bad, f"tiles[{phase!r}]: unknown key(s) {sorted(bad)}"
            upd = over
        else:
            over = tuple(over)
            assert len(over) in (4, 5), f"tiles[{phase!r}]: (BLOCK_Q, BLOCK_KV, BLOCK_D, num_warps[, num_stages])"
            upd = dict(zip(_TILE_KEYS, over))
        cfg.update({k: v for k, v in upd.items() if v is not None or k == "num_stages"})
    for key in ("BLOCK_Q", "BLOCK_KV", "BLOCK_D"):  # tl.dot needs every dimension >= 16
        assert _is_pow2(cfg[key]) and cfg[key] >= 16, f"tiles[{phase!r}] {key}={cfg[key]!r}: a power of two >= 16"
    assert cfg["BLOCK_D"] >= head_dim, f"tiles[{phase!r}] BLOCK_D={cfg['BLOCK_D']} < head_dim {head_dim}"
    assert _is_pow2(cfg["num_warps"]) and cfg["num_warps"] <= 16, f"tiles[{phase!r}] num_warps={cfg['num_warps']!r}"
    ns = cfg["num_stages"]
    assert ns is None or (isinstance(ns, int) and ns >= 1), f"tiles[{phase!r}] num_stages={ns!r}"
    return cfg


def _launch_opts(cfg: dict) -> dict:
    opts = dict(BLOCK_Q=cfg["BLOCK_Q"], BLOCK_KV=cfg["BLOCK_KV"], BLOCK_D=cfg["BLOCK_D"], num_warps=cfg["num_warps"])
    if cfg["num_stages"] is not None:
        opts["num_stages"] = cfg["num_stages"]
    return opts


def _check_scratch(name: str, x, shape) -> None:
    assert x is not None and dtype_name(x) == "float32" and x.is_contiguous() and tuple(x.shape) == shape, \
        f"{name}: fp32 contiguous {shape}"


def vsa_coarse_bwd(qc, kc, vc, kv_sizes, dout, out32, lse, dqc, dkc, dvc, *, sm_scale: float,
                   precision: str = "ieee", p_scratch=None, ds_scratch=None, tiles=None,
                   grad_precision=None) -> None:
    """Gradients of the coarse attention into caller-allocated fp32 ``dqc``/``dkc``/``dvc``
    (contiguous, the shapes of ``qc``/``kc``/``vc``). ``dout``: contiguous ``[B,H,Qb,D]``, any float
    dtype; ``out32``: the forward's fp32 ``out_c``; ``lse``: its fp32 ``[B,H,Qb]`` natural-log LSE.
    ``precision``: one of ``vsa_select.COARSE_PRECISIONS`` (the forward's, to recompute its P:
    ``S = qc kc^T``). ``grad_precision``: the same choice for the four gradient products (``dP =
    dout vc^T``, ``dqc``, ``dkc``, ``dvc``); None: ``precision``.

    ``p_scratch``, ``ds_scratch``: fp32 contiguous ``[B,H,Qb,KVb]``, two distinct tensors, both or
    neither. Given: the two-phase backward, which overwrites them with P and dS (their contents
    on entry do not matter; after the call they hold P and dS). ``None``: the one-launch fused
    kernel (no scratch, slower). This helper allocates nothing.

    ``tiles``: overrides of :func:`coarse_bwd_tiles` per phase (see ``_phase_config``), e.g.
    ``{"a": (16, 32, None, 4), "b": {"BLOCK_Q": 64, "num_stages": 2}}``."""
    assert precision in COARSE_PRECISIONS, f"precision {precision!r}"
    grad_precision = precision if grad_precision is None else grad_precision
    assert grad_precision in COARSE_PRECISIONS, f"grad_precision {grad_precision!r}"
    B, H, Qb, D = qc.shape
    KVb = kc.shape[2]
    for name, x, shape in (("qc", qc, (B, H, Qb, D)), ("kc", kc, (B, H, KVb, D)), ("vc", vc, (B, H, KVb, D)),
                           ("out32", out32, (B, H, Qb, D)), ("dqc", dqc, (B, H, Qb, D)),
                           ("dkc", dkc, (B, H, KVb, D)), ("dvc", dvc, (B, H, KVb, D))):
        assert dtype_name(x) == "float32" and x.is_contiguous() and tuple(x.shape) == shape, f"{name}"
    assert dout.is_contiguous() and tuple(dout.shape) == (B, H, Qb, D), "dout"
    assert dtype_name(lse) == "float32" and lse.is_contiguous() and tuple(lse.shape) == (B, H, Qb), "lse"
    assert dtype_name(kv_sizes) == "int32" and kv_sizes.is_contiguous() and kv_sizes.numel() == KVb
    assert (p_scratch is None) == (ds_scratch is None), "p_scratch and ds_scratch: both or neither"
    two_phase = p_scratch is not None
    if two_phase:
        _check_scratch("p_scratch", p_scratch, (B, H, Qb, KVb))
        _check_scratch("ds_scratch", ds_scratch, (B, H, Qb, KVb))
        assert Qb * KVb == 0 or p_scratch.data_ptr() != ds_scratch.data_ptr(), "p_scratch and ds_scratch alias"
    bh = B * H
    if bh == 0 or (Qb == 0 and KVb == 0):
        return
    sm_scale = float(sm_scale)
    if not two_phase:
        cfg = _phase_config(tiles, "fused", D)
        nqt = triton.cdiv(Qb, cfg["BLOCK_Q"])
        _vsa_coarse_bwd_kernel[(nqt + triton.cdiv(KVb, cfg["BLOCK_KV"]), bh)](
            qc, kc, vc, kv_sizes, dout, out32, lse, dqc, dkc, dvc,
            Qb, KVb, D, nqt,
            sm_scale,
            PRECISION=precision, GRAD_PRECISION=grad_precision, **_launch_opts(cfg),
        )
        return
    cfg_a, cfg_b = _phase_config(tiles, "a", D), _phase_config(tiles, "b", D)
    if Qb:  # with KVb == 0 this writes dqc = 0 and stores nothing
        _coarse_bwd_q_kernel[(triton.cdiv(Qb, cfg_a["BLOCK_Q"]), bh)](
            qc, kc, vc, kv_sizes, dout, out32, lse, dqc, p_scratch, ds_scratch,
            Qb, KVb, D,
            sm_scale,
            PRECISION=precision, GRAD_PRECISION=grad_precision, **_launch_opts(cfg_a),
        )
    if KVb:  # with Qb == 0 this writes dkc = dvc = 0
        _coarse_bwd_kv_kernel[(triton.cdiv(KVb, cfg_b["BLOCK_KV"]), bh)](
            qc, dout, p_scratch, ds_scratch, dkc, dvc,
            Qb, KVb, D,
            sm_scale,
            GRAD_PRECISION=grad_precision, **_launch_opts(cfg_b),
        )
