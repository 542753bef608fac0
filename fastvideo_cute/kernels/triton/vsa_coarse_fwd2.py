"""Two-phase forward of VSA's coarse attention (``vsa_select_fwd(coarse_variant="twophase")``).

The same contract as ``vsa_select._vsa_coarse_fwd_kernel`` (the one-pass kernel): from fp32 block
means ``qc [B,H,Qb,D]``, ``kc``/``vc [B,H,KVb,D]`` and the int32 kv block sizes ``[KVb]``,

- ``s = (qc @ kc^T) * sm_scale``, ``-inf`` for kv blocks of size 0, stored to the scores scratch
  ``[B,H,Qb,KVb]`` fp32 (what the top-k reads);
- ``out_c = softmax(s) @ vc`` cast to ``out``'s dtype (an optional fp32 copy ``out32``) and the
  natural-log row LSE; a row whose kv blocks are all empty gets ``out_c = 0`` and LSE ``-inf``;
  a NaN in a row makes its ``out_c`` and LSE NaN.

Why. The one-pass kernel has one program per 32-row q tile walk every kv chunk with an online
softmax: a long serial chain of tiny dots (32 x 32 x 128) per program, latency bound on the H200
(2.46 ms at HunyuanVideo 720p, H=24, 1800 blocks: ~24 TF/s). Here the chain is cut in two:

1. **Phase 1** ``_coarse_fwd2_scores_kernel``, grid ``(cdiv(Qb, BQ1), cdiv(KVb, BKV1), B*H)``,
   fully parallel, one ``[BQ1, BKV1]`` tile per program and no loop: ``s = dot(qc, kc^T) *
   sm_scale`` (one ``tl.dot`` over the whole head_dim, the one-pass kernel's expression and
   ``input_precision``), ``-inf`` at empty kv blocks, stored to ``scores``; plus the tile's
   partial softmax state per row, in the log2 domain as the one-pass kernel
   (``s2 = s * log2(e)``): ``m_t = max_j s2`` and ``l_t = sum_j exp2(s2 - m_t)``. A tile whose
   columns are all ``-inf`` stores ``m_t = -inf, l_t = 0`` (``m_t`` is replaced by 0 before the
   subtraction, so no ``-inf - -inf``). Partials: fp32 ``[B*H*Qb, NT, 2]`` with ``NT =
   cdiv(KVb, BKV1)``, ``(m_t, l_t)`` of row ``r`` and kv tile ``t`` at ``[r, t]``.
2. **Phase 2** ``_coarse_fwd2_out_kernel``, grid ``(cdiv(Qb, BQ2), B*H, cdiv(D, BD2))``: a
   ``BQ2``-row tile combines its rows' partials in a fixed order (tile chunks of ``BLOCK_T`` in
   index order; within a chunk Triton's fixed reduction tree): ``m = max_t m_t``, ``l = sum_t
   l_t * exp2(m_t - m)``; then walks the stored scores in ``BKV2`` chunks, ``p = exp2(s2 - m)``
   (<= 1; 0 at ``-inf`` scores) and ``acc += dot(p, vc)``: one dot per chunk, no max, no
   rescaling, so only the accumulator carries from one chunk to the next. Epilogue as
   ``vsa_select._coarse_epilogue`` (``out = acc / l``; ``l == 0`` -> ``out_c = 0``, LSE ``-inf``;
   NaN stays NaN), the LSE stored by the first D split only. ``BD2 < head_dim`` splits D over
   programs (each recombines the same partials: cheap, and bitwise the same ``m``/``l``).

Numerics. Each score is one dot over D with the same precision as the one-pass kernel; only the
tile shape differs. Under the interpreter (CPU) the dot is a BLAS matmul of the tile, whose
summation order depends on the tile shape (the one-pass kernel's own scores change bits with its
tiles): the scores are bitwise the one-pass kernel's when phase 1's ``(BLOCK_Q, BLOCK_KV)`` equal
its tiles, within fp32 rounding (~1 ulp) otherwise. On a GPU each MMA walks D in the same order,
but another tile may pick another instruction kind (wgmma for 64-row tiles vs mma for the
one-pass kernel's 32): equal bits likely, not promised (``bench_glue.py`` reports whether the
top-k lists match). ``out_c``/LSE are the same sums in another order: equal to fp32 rounding.

Constraints. Inputs fp32 contiguous, any head_dim (masked lanes; phase 1's ``BLOCK_D`` covers all
of it); every tile dimension a power of two >= 16 (``tl.dot``). The scores buffer is required
even when no top-k is taken (``topk >= KVb``): phase 2 reads it back. Deterministic: every output
element is written by one program in a fixed order; no atomics.

Memory. The scores scratch ``B*H*Qb*KVb*4`` bytes (311 MB at HunyuanVideo 720p, H=24, 1800
blocks; the one-pass path needs it too whenever a top-k is taken) and the partials
``B*H*Qb*NT*2*4`` bytes (:func:`coarse_fwd2_scratch_numel`; 10 MB there with 64-column tiles;
448 MB and 14 MB at 2160 blocks, HunyuanVideo 720p with 64-token tiles), both caller-allocated
and free after the call; nothing of either is needed by the backward. Traffic: the scores are
written once (as by the one-pass kernel) and read once more by phase 2 (~0.1 ms of HBM at 448 MB
on the H200), the price of cutting the chain; the partials are small. This
module allocates nothing and does not import torch; the launch helper writes into caller-allocated
tensors on the current CUDA device (CPU tensors under ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import contextlib
from typing import Optional, Tuple

import triton
import triton.language as tl

from .vsa_common import dtype_name, pow2_lanes

__all__ = ["vsa_coarse_fwd2", "coarse_fwd2_tiles", "coarse_fwd2_scratch_numel", "resolve_fwd2_tiles",
           "FWD2_PRECISIONS"]

# tl.dot input_precision values accepted: vsa_select.COARSE_PRECISIONS (restated, not imported:
# vsa_select imports this module; tests/kernels/triton/test_vsa_coarse_fwd2.py checks they agree).
FWD2_PRECISIONS = ("ieee", "tf32x3", "tf32")

@triton.jit
def _coarse_fwd2_scores_kernel(
    QC, KC, KV_SIZES, SCORES, PART,
    Qb, KVb, D, NT,
    sm_scale,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Phase 1: one [BLOCK_Q, BLOCK_KV] tile of scores and its rows' partial (max, sum)."""
    pid_q = tl.program_id(0)
    pid_kv = tl.program_id(1)
    bh = tl.program_id(2).to(tl.int64)
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rmask = rows < Qb
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    cols = pid_kv * BLOCK_KV + tl.arange(0, BLOCK_KV)
    cmask = cols < KVb
    q_rows = bh * Qb + rows.to(tl.int64)  # row index into [B*H*Qb]
    qc = tl.load(QC + q_rows[:, None] * D + offs_d[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)
    present = tl.load(KV_SIZES + cols, mask=cmask, other=0) > 0  # out-of-range columns read size 0: absent
    kc = tl.load(KC + bh * KVb * D + cols.to(tl.int64)[:, None] * D + offs_d[None, :],
                 mask=cmask[:, None] & dmask[None, :], other=0.0)
    s = tl.dot(qc, tl.trans(kc), input_precision=PRECISION) * sm_scale
    s = tl.where(present[None, :], s, float("-inf"))
    tl.store(SCORES + q_rows[:, None] * KVb + cols[None, :], s, mask=rmask[:, None] & cmask[None, :])
    s2 = s * 1.4426950408889634  # log2 domain
    m_t = tl.max(s2, 1)
    # A tile whose columns are all absent keeps m = -inf and sums exp2(-inf - 0) = 0: l = 0.
    m_safe = tl.where(m_t == float("-inf"), 0.0, m_t)
    l_t = tl.sum(tl.math.exp2(s2 - m_safe[:, None]), 1)
    part = PART + (q_rows * NT + pid_kv) * 2
    tl.store(part, m_t, mask=rmask)
    tl.store(part + 1, l_t, mask=rmask)


@triton.jit
def _coarse_fwd2_out_kernel(
    VC, SCORES, PART, OUT, OUT32, LSE,
    Qb, KVb, D, NT,
    BLOCK_Q: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_T: tl.constexpr,
    WRITE_OUT32: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Phase 2: the rows' (m, l) from the partials, then out_c = sum_t exp2(s2_t - m) @ vc_t / l."""
    pid_q = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    pid_d = tl.program_id(2)
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    rmask = rows < Qb
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q_rows = bh * Qb + rows.to(tl.int64)
    offs_t = tl.arange(0, BLOCK_T)
    part_rows = PART + q_rows[:, None] * NT * 2
    # The row max over the tiles' maxima, then the tiles' sums rescaled to it: tiles in index order.
    # Elementwise accumulators over the chunks, reduced once after each loop (a reduction inside
    # the loop body makes Triton 3.6's TritonGPUOptimizeThreadLocality pass fail on sm_90).
    m_acc = tl.full([BLOCK_Q, BLOCK_T], float("-inf"), dtype=tl.float32)
    for t0 in range(0, NT, BLOCK_T):
        t = t0 + offs_t
        tm = rmask[:, None] & (t < NT)[None, :]
        m_acc = tl.maximum(m_acc, tl.load(part_rows + t[None, :] * 2, mask=tm, other=float("-inf")))
    m_i = tl.max(m_acc, 1)
    m_safe = tl.where(m_i == float("-inf"), 0.0, m_i)  # every kv block empty: l stays 0
    l_acc = tl.zeros([BLOCK_Q, BLOCK_T], dtype=tl.float32)
    for t1 in range(0, NT, BLOCK_T):
        tt = t1 + offs_t
        ttm = rmask[:, None] & (tt < NT)[None, :]
        pm = tl.load(part_rows + tt[None, :] * 2, mask=ttm, other=float("-inf"))
        pl = tl.load(part_rows + tt[None, :] * 2 + 1, mask=ttm, other=0.0)
        l_acc = l_acc + pl * tl.math.exp2(pm - m_safe[:, None])
    l_i = tl.sum(l_acc, 1)

    offs_c = tl.arange(0, BLOCK_KV)
    kv_base = bh * KVb * D
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    for c0 in range(0, KVb, BLOCK_KV):
        cols = c0 + offs_c
        cmask = cols < KVb
        s = tl.load(SCORES + q_rows[:, None] * KVb + cols[None, :], mask=rmask[:, None] & cmask[None, :],
                    other=float("-inf"))
        p = tl.math.exp2(s * 1.4426950408889634 - m_safe[:, None])
        vc = tl.load(VC + kv_base + cols.to(tl.int64)[:, None] * D + offs_d[None, :],
                     mask=cmask[:, None] & dmask[None, :], other=0.0)
        acc = tl.dot(p, vc, acc, input_precision=PRECISION)

    # Epilogue: vsa_select._coarse_epilogue's arithmetic; the LSE from the first D split only.
    has_key = l_i != 0.0  # l == 0: every kv block empty (out_c 0, lse -inf); a NaN l stays NaN
    inv_l = tl.where(has_key, tl.math.div_rn(1.0, tl.where(has_key, l_i, 1.0)), 0.0)
    out = acc * inv_l[:, None]
    lse = tl.where(has_key, (m_i + tl.math.log2(tl.where(has_key, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    o_ptrs = q_rows[:, None] * D + offs_d[None, :]
    omask = rmask[:, None] & dmask[None, :]
    tl.store(OUT + o_ptrs, out.to(OUT.dtype.element_ty), mask=omask)
    if WRITE_OUT32:
        tl.store(OUT32 + o_ptrs, out, mask=omask)
    if pid_d == 0:
        tl.store(LSE + q_rows, lse, mask=rmask)


_Cfg = Tuple[int, int, int, int, Optional[int]]


def coarse_fwd2_tiles(head_dim: int) -> Tuple[_Cfg, _Cfg]:
    """Default ``((BQ1, BKV1, BD1, warps1, stages1), (BQ2, BKV2, BD2, warps2, stages2))`` of the
    two phases at ``head_dim`` (``stages`` ``None``: Triton's default); ``benchmarks/bench_glue.py``
    sweeps ``COARSE2_VARIANTS``:

    - phase 1, 64 x 64, 4 warps (64-row tiles: wgmma on sm_90), one dot of 64 x 64 x 128 per
      program and no loop (so no pipelining): qc and kc tiles of 32 KB each; head_dim > 128:
      32 x 32 (the operands of 256 lanes). HunyuanVideo 720p: 29 x 29 x 24 = 20,184 programs.
    - phase 2, 32 x 32 with 64 head_dim lanes per program (head_dim 128: two D splits), 2 warps,
      3 stages: per kv chunk a 4 KB scores tile and an 8 KB vc tile; the accumulator ``[32, 64]``.
      Wan-1.3B 480p: 20 x 12 x 2 = 480 programs of 20 chunks each. Measured on the H200
      (``benchmarks/results/glue_h200_v5.json``, kernel time from ``torch.profiler``, 64-token
      tiles, 87.5 %): 37.2 us at Wan-1.3B 480p (the former 64 x 64 x 64, 4 warps: 56.4 us) and
      512 us at Wan-14B 720p (823 us); phase 1 as here 31.4 / 472 us; the pair 68.5 / 984 us
      against the one-pass kernel's 78.3 / 1153 us.
    """
    block_d = pow2_lanes(head_dim, 16)
    p1 = (64, 64, block_d, 4, None) if block_d <= 128 else (32, 32, block_d, 4, None)
    p2 = (32, 32, min(64, block_d), 2, 3)
    return p1, p2


def _is_pow2(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and (x & (x - 1)) == 0


def resolve_fwd2_tiles(tiles, head_dim: int) -> Tuple[_Cfg, _Cfg]:
    """:func:`coarse_fwd2_tiles` with ``tiles`` laid over them. ``tiles``: ``None`` or a pair
    ``(cfg1, cfg2)``; a ``cfg`` is ``None`` (that phase's default) or ``(BLOCK_Q, BLOCK_KV, BLOCK_D,
    num_warps[, num_stages])`` where any entry may be ``None`` or left out (num_stages): that phase's
    default. Phase 1's ``BLOCK_D``
    must cover head_dim; phase 2's may be smaller (D split over programs). Raises ``ValueError``."""
    defaults = coarse_fwd2_tiles(head_dim)
    if tiles is None:
        return defaults
    tiles = tuple(tiles)
    if len(tiles) != 2:
        raise ValueError(f"phase_tiles must be (phase-1 cfg, phase-2 cfg), got {tiles!r}")
    out = []
    for phase, (cfg, dflt) in enumerate(zip(tiles, defaults), start=1):
        if cfg is None:
            out.append(dflt)
            continue
        cfg = tuple(cfg)
        if len(cfg) not in (4, 5):
            raise ValueError(f"phase_tiles[{phase - 1}] must be (BLOCK_Q, BLOCK_KV, BLOCK_D, num_warps"
                             f"[, num_stages]), got {cfg!r}")
        cfg = cfg + (None,) * (5 - len(cfg))
        bq, bkv, bd, w, st = (d if c is None else c for c, d in zip(cfg, dflt))
        for name, x in (("BLOCK_Q", bq), ("BLOCK_KV", bkv), ("BLOCK_D", bd)):
            if not _is_pow2(x) or x < 16:
                raise ValueError(f"phase {phase} tiles: {name}={x!r} must be a power of two >= 16 (tl.dot)")
        if phase == 1 and bd < head_dim:
            raise ValueError(f"phase 1 tiles: BLOCK_D={bd} < head_dim {head_dim} (one dot over all of D)")
        if w not in (1, 2, 4, 8, 16):
            raise ValueError(f"phase {phase} tiles: num_warps={w!r} must be one of 1, 2, 4, 8, 16")
        if st is not None and (not isinstance(st, int) or isinstance(st, bool) or st < 1):
            raise ValueError(f"phase {phase} tiles: num_stages={st!r} must be an int >= 1")
        out.append((bq, bkv, bd, w, st))
    return out[0], out[1]


def coarse_fwd2_scratch_numel(B: int, H: int, Qb: int, KVb: int, head_dim: int, tiles=None) -> int:
    """fp32 elements of the ``partial_scratch`` the two-phase forward needs with these tiles
    (``tiles``: as :func:`resolve_fwd2_tiles`, ``None`` for the defaults): ``B*H*Qb * NT * 2``,
    ``NT = cdiv(KVb, BLOCK_KV of phase 1)`` (each row's (max, sum) per kv tile)."""
    block_kv = resolve_fwd2_tiles(tiles, head_dim)[0][1]
    return int(B) * int(H) * int(Qb) * triton.cdiv(int(KVb), block_kv) * 2


def _opts(warps, stages) -> dict:
    return {"num_warps": warps} if stages is None else {"num_warps": warps, "num_stages": stages}


def vsa_coarse_fwd2(qc, kc, vc, kv_sizes, out, out32, lse, scores, partial_scratch, *, sm_scale: float,
                    precision: str = "ieee", tiles=None, phase2_context=None) -> None:
    """Two-phase coarse attention forward into caller-allocated tensors (two launches).

    ``qc [B,H,Qb,D]``, ``kc``/``vc [B,H,KVb,D]``: fp32 contiguous; ``kv_sizes``: int32 ``[KVb]``;
    ``out``: ``[B,H,Qb,D]`` contiguous, any float dtype; ``out32``: fp32 like ``out`` or ``None``;
    ``lse``: fp32 ``[B,H,Qb]``. ``scores``: fp32 contiguous ``[B,H,Qb,KVb]``, always required (phase
    2 reads it back), overwritten with the scores. ``partial_scratch``: fp32 contiguous, at least
    :func:`coarse_fwd2_scratch_numel` ``(B, H, Qb, KVb, D, tiles)`` elements (contents on entry do
    not matter). ``precision``: one of :data:`FWD2_PRECISIONS` (``vsa_select.COARSE_PRECISIONS``). ``tiles``: see
    :func:`resolve_fwd2_tiles`. ``phase2_context``: ``None`` or a context manager entered around
    phase 2's launch only (``vsa_select_fwd(side=)`` puts it on a second stream that way, so that
    the caller's next launch, the top-k, which reads only phase 1's scores, runs beside it).
    Raises ``ValueError`` for a missing / wrong scratch or bad tiles."""
    if precision not in FWD2_PRECISIONS:
        raise ValueError(f"precision {precision!r} not in {FWD2_PRECISIONS}")
    B, H, Qb, D = qc.shape
    KVb = kc.shape[2]
    for name, x, shape in (("qc", qc, (B, H, Qb, D)), ("kc", kc, (B, H, KVb, D)), ("vc", vc, (B, H, KVb, D))):
        assert dtype_name(x) == "float32" and x.is_contiguous() and tuple(x.shape) == shape, f"{name}"
    assert dtype_name(kv_sizes) == "int32" and kv_sizes.is_contiguous() and kv_sizes.numel() == KVb, "kv_sizes"
    assert out.is_contiguous() and tuple(out.shape) == (B, H, Qb, D), "out"
    if out32 is not None:
        assert dtype_name(out32) == "float32" and out32.is_contiguous() and tuple(out32.shape) == (B, H, Qb, D)
    assert dtype_name(lse) == "float32" and lse.is_contiguous() and tuple(lse.shape) == (B, H, Qb), "lse"
    if scores is None or dtype_name(scores) != "float32" or not scores.is_contiguous() \
            or tuple(scores.shape) != (B, H, Qb, KVb):
        raise ValueError(f"the two-phase coarse forward needs scores: fp32 contiguous {(B, H, Qb, KVb)} "
                         "(also when topk >= KVb: phase 2 reads the scores back)")
    (bq1, bkv1, bd1, w1, st1), (bq2, bkv2, bd2, w2, st2) = resolve_fwd2_tiles(tiles, D)
    need = coarse_fwd2_scratch_numel(B, H, Qb, KVb, D, tiles)
    if partial_scratch is None or dtype_name(partial_scratch) != "float32" or not partial_scratch.is_contiguous() \
            or partial_scratch.numel() < need:
        raise ValueError(f"the two-phase coarse forward needs partial_scratch: fp32 contiguous, >= {need} elements "
                         "(coarse_fwd2_scratch_numel)")
    bh = B * H
    if bh == 0 or Qb == 0 or KVb == 0:
        return
    nt = triton.cdiv(KVb, bkv1)
    _coarse_fwd2_scores_kernel[(triton.cdiv(Qb, bq1), nt, bh)](
        qc, kc, kv_sizes, scores, partial_scratch,
        Qb, KVb, D, nt,
        float(sm_scale),
        BLOCK_Q=bq1, BLOCK_KV=bkv1, BLOCK_D=bd1, PRECISION=precision,
        **_opts(w1, st1),
    )
    with (phase2_context if phase2_context is not None else contextlib.nullcontext()):
        _coarse_fwd2_out_kernel[(triton.cdiv(Qb, bq2), bh, triton.cdiv(D, bd2))](
            vc, scores, partial_scratch, out, out32 if out32 is not None else out, lse,
            Qb, KVb, D, nt,
            BLOCK_Q=bq2, BLOCK_KV=bkv2, BLOCK_D=bd2, BLOCK_T=min(triton.next_power_of_2(nt), 64),
            WRITE_OUT32=out32 is not None, PRECISION=precision,
            **_opts(w2, st2),
        )
