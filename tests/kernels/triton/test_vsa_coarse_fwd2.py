"""The two-phase coarse forward (``kernels/triton/vsa_coarse_fwd2.py``, reached through
``vsa_select_fwd(coarse_variant="twophase")``) against the fp32 reference
(``coarse_attention_reference``) and against the one-pass kernel (``_vsa_coarse_fwd_kernel``).

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py), fp32 ("ieee" dots). Shapes
are small, with overridden (small) tiles so that phase 1 stores several kv tiles of partials and
phase 2 walks several kv chunks and, with a phase-2 ``BLOCK_D`` below head_dim, splits D; Qb !=
KVb, neither a multiple of the tiles; head_dim 32, 48 (masked lanes, and a half-masked D split),
64, 128; empty kv blocks, including a whole phase-1 tile of them (partial ``m = -inf, l = 0``).
Every scratch the kernels read (scores, partials) is NaN-filled first: what phase 2 reads must
have been written by phase 1.

Measured on CPU (interpreter, numpy/OpenBLAS dots), max abs error over SHAPES (with their tiles
and with the default tiles): ``out_c`` 9.5e-7 and LSE 4.8e-7 against the reference (the one-pass
kernel's own errors there are the same, 9.5e-7 / 4.8e-7), 2.4e-7 / 4.8e-7 against the one-pass
kernel; scores (|s| <= 4.8) 1.7e-6 against the reference, 1.3e-6 against the one-pass kernel when
the tiles differ. TOL (atol = rtol = 1e-5, the existing selection tests' bound) is >= 10x headroom
for ``out_c``/LSE and >= 5x for the scores (>= 30x at |s| ~ 5). Scores: the interpreter's dot is a BLAS matmul of the
tile, whose summation order depends on the tile shape (the one-pass kernel's own scores change
bits with its tiles), so the two-phase scores are bitwise the one-pass kernel's when phase 1 uses
the one-pass kernel's (BLOCK_Q, BLOCK_KV) (checked with ``torch.equal`` on every shape, and then
the top-k lists are equal too) and within TOL with other tiles; on integer-valued means every
order gives the exact scores, so the lists are equal with any tiles. An fp16 ``out_c`` is one
fp16 rounding of the fp32 value: rtol 1e-3.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute import vsa_ops  # noqa: E402
from fastvideo_cute.kernels.triton.vsa_coarse_fwd2 import (FWD2_PRECISIONS, coarse_fwd2_scratch_numel,  # noqa: E402
                                                           coarse_fwd2_tiles, resolve_fwd2_tiles, vsa_coarse_fwd2)
from fastvideo_cute.kernels.triton.vsa_select import COARSE_PRECISIONS, COARSE_VARIANTS, vsa_select_fwd  # noqa: E402
from fastvideo_cute.reference import coarse_attention_reference, topk_indices_reference  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
TOL = dict(atol=1e-5, rtol=1e-5)
NAN = float("nan")


def _means(b, h, qb, kvb, d, seed=0, integer=False):
    g = torch.Generator().manual_seed(seed)
    if integer:  # small integers: every dot product (and its scaling by a power of two) is exact
        mk = lambda n: torch.randint(-2, 3, (b, h, n, d), generator=g).float()  # noqa: E731
    else:
        mk = lambda n: torch.randn(b, h, n, d, generator=g)  # noqa: E731
    return mk(qb).to(DEV), mk(kvb).to(DEV), torch.randn(b, h, kvb, d, generator=g).to(DEV)


def _sizes(*vals):
    return torch.tensor(vals, dtype=torch.int32, device=DEV)


def _run(qc, kc, vc, sizes, topk, variant="twophase", out_dtype=torch.float32, with_out32=False, sm_scale=None,
         **kw):
    """vsa_select_fwd into fresh tensors (NaN / -1 filled): (out, out32, lse, idx, num, scores).
    The top-k runs as "rows16w1x" (16 rows per program: ~5x faster than "search32" under the
    interpreter; every variant gives the same lists, test_vsa_select_triton checks that)."""
    b, h, qb, d = qc.shape
    kvb = kc.shape[2]
    k = min(topk, kvb)
    sm_scale = d ** -0.5 if sm_scale is None else sm_scale
    out = torch.full((b, h, qb, d), NAN, dtype=out_dtype, device=DEV)
    out32 = torch.full((b, h, qb, d), NAN, device=DEV) if with_out32 else None
    lse = torch.full((b, h, qb), NAN, device=DEV)
    idx = torch.full((b, h, qb, k), -1, dtype=torch.int32, device=DEV)
    num = torch.full((b, h, qb), -1, dtype=torch.int32, device=DEV)
    scores = None
    if variant == "twophase":
        scores = torch.full((b, h, qb, kvb), NAN, device=DEV)  # needed even when k == KVb
        kw.setdefault("partial_scratch", torch.full(
            (coarse_fwd2_scratch_numel(b, h, qb, kvb, d, kw.get("phase_tiles")),), NAN, device=DEV))
        kw["coarse_variant"] = "twophase"
    elif k < kvb:
        scores = torch.full((b, h, qb, kvb), NAN, device=DEV)
    kw.setdefault("topk_variant", "rows16w1x")
    vsa_select_fwd(qc, kc, vc, sizes, out, out32, lse, idx, num, scores, topk=topk, sm_scale=sm_scale, **kw)
    return out, out32, lse, idx, num, scores


# (Qb, KVb, head_dim, kv sizes, phase_tiles). Phase-1 tiles equal to a one-pass tiling (the
# one-pass kernel is run with the same (BLOCK_Q, BLOCK_KV)): bitwise-equal scores on CPU.
SHAPES = [
    # 3 x 3 phase-1 tiles, the first kv tile all empty (partials m = -inf, l = 0); phase 2: 3 kv
    # chunks, D split in 2 (32 lanes each)
    (37, 45, 64, [0] * 16 + [3, 0, 7] * 9 + [1, 2], ((16, 16, None, 4), (16, 16, 32, 4))),
    # head_dim 48 (masked lanes in phase 1; phase-2 D split 32 + 16 masked lanes), Qb > KVb
    (45, 19, 48, [0, 2, 5, 0] * 4 + [1, 1, 0], ((32, 16, None, 4), (16, 16, 32, 2, 2))),
    # head_dim 32 with the default tiles (one 64 x 64 tile), Qb < one tile
    (5, 40, 32, [16, 0, 5, 16] * 10, None),
    # head_dim 128: one-pass-like 32 x 32 phase 1, phase 2 over 16-column chunks, no D split
    (21, 70, 128, [1, 0] * 35, ((32, 32, None, 4), (32, 16, 128, 4))),
]
_IDS = [f"{s[0]}x{s[1]}xd{s[2]}" for s in SHAPES]


KV40 = [16, 0, 5, 16] * 10  # every fourth block (from the second) is empty


def _onepass_tiles(phase_tiles, d):
    bq, bkv = resolve_fwd2_tiles(phase_tiles, d)[0][:2]
    return (bq, bkv, None, 4)


@pytest.mark.parametrize("qb,kvb,d,kv_sizes,phase_tiles", SHAPES, ids=_IDS)
def test_twophase_matches_reference_and_onepass(qb, kvb, d, kv_sizes, phase_tiles):
    qc, kc, vc = _means(2, 2, qb, kvb, d, seed=qb + kvb + d)
    sizes = _sizes(*kv_sizes)
    topk = max(1, kvb // 4)
    out, out32, lse, idx, num, scores = _run(qc, kc, vc, sizes, topk, with_out32=True, phase_tiles=phase_tiles)
    ref_out, ref_lse, ref_scores = coarse_attention_reference(qc, kc, vc, sizes)
    torch.testing.assert_close(out, ref_out, **TOL)
    assert torch.equal(out32, out)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    empty = (sizes == 0).expand_as(scores)
    assert torch.isneginf(scores[empty]).all() and torch.isfinite(scores[~empty]).all()
    torch.testing.assert_close(scores[~empty], ref_scores[~empty], **TOL)
    assert (num == topk).all() and torch.equal(idx.long(), topk_indices_reference(scores, topk))
    # the one-pass kernel with the same (BLOCK_Q, BLOCK_KV): the same scores, bit for bit, so the same lists
    one = _run(qc, kc, vc, sizes, topk, variant="onepass", with_out32=True, tiles=_onepass_tiles(phase_tiles, d))
    if HAS_CUDA:  # another MMA instruction kind may round differently: equal bits likely, not promised
        torch.testing.assert_close(scores, one[5], **TOL)
    else:
        assert torch.equal(scores, one[5])
        assert torch.equal(idx, one[3]) and torch.equal(num, one[4])
    for got, want in ((out, one[0]), (out32, one[1]), (lse, one[2])):
        torch.testing.assert_close(got, want, **TOL)


def test_exact_scores_give_the_default_onepass_lists_with_any_tiles():
    """Integer means (D=16, scale 1/4): every score is exact whatever the tile, with many ties; the
    two-phase lists (several tilings) equal the default one-pass kernel's, bit for bit."""
    qc, kc, vc = _means(2, 2, 6, 37, 16, seed=3, integer=True)
    sizes = _sizes(*([9] * 36 + [0]))
    ref = _run(qc, kc, vc, sizes, topk=5, variant="onepass", sm_scale=0.25)
    for phase_tiles in (None, ((16, 16, None, 4), (16, 16, 16, 4)), ((32, 64, None, 2), (16, 32, None, 1))):
        got = _run(qc, kc, vc, sizes, topk=5, sm_scale=0.25, phase_tiles=phase_tiles)
        assert torch.equal(got[5], ref[5]) and torch.equal(got[3], ref[3]) and torch.equal(got[4], ref[4])
        torch.testing.assert_close(got[0], ref[0], **TOL)
        torch.testing.assert_close(got[2], ref[2], **TOL)


def test_fp16_out_with_and_without_out32():
    qc, kc, vc = _means(1, 2, 19, 33, 64, seed=4)
    sizes = _sizes(*([4, 4, 0] * 11))
    tiles = ((16, 16, None, 4), (16, 16, 64, 4))
    ref_out = coarse_attention_reference(qc, kc, vc, sizes)[0]
    for with_out32 in (True, False):
        out, out32, lse, idx, num, _ = _run(qc, kc, vc, sizes, 3, out_dtype=torch.float16, with_out32=with_out32,
                                            phase_tiles=tiles)
        assert out.dtype == torch.float16
        torch.testing.assert_close(out.float(), ref_out, atol=1e-3, rtol=1e-3)
        if with_out32:
            torch.testing.assert_close(out32, ref_out, **TOL)
            assert torch.equal(out32.to(torch.float16), out)  # out is the fp32 value rounded once


@pytest.mark.parametrize("topk", [5, 9])
def test_topk_at_least_kvb_still_needs_and_writes_scores(topk):
    """topk >= KVb: every block, in order; the two-phase path still takes (and fills) the scores."""
    qc, kc, vc = _means(1, 2, 3, 5, 32, seed=5)
    sizes = _sizes(4, 0, 4, 4, 1)
    out, _, lse, idx, num, scores = _run(qc, kc, vc, sizes, topk=topk)
    assert idx.shape[-1] == 5 and (num == 5).all()
    assert torch.equal(idx, torch.arange(5, dtype=torch.int32, device=DEV).expand_as(idx))
    ref_out, ref_lse, ref_scores = coarse_attention_reference(qc, kc, vc, sizes)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    torch.testing.assert_close(scores, ref_scores, **TOL)  # -inf at the empty block on both sides


def test_all_kv_blocks_empty():
    """Nothing to attend to (several phase-1 kv tiles, all m = -inf, l = 0): out_c 0, lse -inf,
    scores -inf; the top-k of an all -inf row is its first k blocks."""
    qc, kc, vc = _means(1, 1, 20, 37, 32, seed=6)
    sizes = _sizes(*([0] * 37))
    out, out32, lse, idx, num, scores = _run(qc, kc, vc, sizes, topk=2, with_out32=True,
                                             phase_tiles=((16, 16, None, 4), (16, 16, 16, 4)))
    assert (out == 0).all() and (out32 == 0).all() and torch.isneginf(lse).all() and torch.isneginf(scores).all()
    assert torch.equal(idx, torch.tensor([0, 1], dtype=torch.int32, device=DEV).expand_as(idx))


def test_nan_rows_propagate_and_are_selected_first():
    qc, kc, vc = _means(1, 1, 20, 40, 32, seed=8)
    qc[0, 0, 17, 3] = NAN  # q block 17 (second q tile): a NaN mean -> a NaN scores row
    tiles = ((16, 16, None, 4), (16, 16, 16, 4))
    sizes = _sizes(*KV40)
    out, _, lse, idx, _, scores = _run(qc, kc, vc, sizes, topk=3, phase_tiles=tiles)
    assert torch.isnan(out[0, 0, 17]).all() and torch.isnan(lse[0, 0, 17])
    rest = [r for r in range(20) if r != 17]
    assert torch.isfinite(out[0, 0, rest]).all() and torch.isfinite(lse[0, 0, rest]).all()
    assert torch.equal(idx[0, 0, 17], torch.tensor([0, 2, 3], dtype=torch.int32, device=DEV))  # non-empty NaNs
    assert torch.equal(idx.long(), topk_indices_reference(scores, 3))
    kc[0, 0, 22, 0] = NAN  # kv block 22 (a present one, second kv tile): a NaN column in every row
    out, _, lse, idx, _, scores = _run(qc, kc, vc, sizes, topk=3, phase_tiles=tiles)
    assert torch.isnan(out).all() and torch.isnan(lse).all()  # softmax over a NaN: NaN, as torch
    assert (idx[0, 0, rest] == 22).any(dim=-1).all()
    assert torch.equal(idx.long(), topk_indices_reference(scores, 3))


def test_twophase_is_deterministic():
    qc, kc, vc = _means(2, 2, 37, 40, 48, seed=13)
    sizes = _sizes(*KV40)
    tiles = ((16, 16, None, 4), (16, 16, 16, 4))
    a = _run(qc, kc, vc, sizes, 6, with_out32=True, phase_tiles=tiles)
    b = _run(qc, kc, vc, sizes, 6, with_out32=True, phase_tiles=tiles)
    assert all(torch.equal(x, y) for x, y in zip(a, b) if x is not None)


def test_vsa_ops_switch_runs_the_two_phase_path(monkeypatch):
    """vsa_ops._COARSE_VARIANT = "twophase" (the default since glue_h200_v5.json): the op allocates the scores / partials scratch itself
    (also for topk >= KVb) and agrees with the default one-pass path."""
    qc, kc, vc = _means(1, 2, 9, 21, 32, seed=30)
    sizes = _sizes(*([2, 0, 3] * 7))
    for topk in (4, 30):
        monkeypatch.setattr(vsa_ops, "_COARSE_VARIANT", "onepass")
        want = vsa_ops.vsa_select(qc, kc, vc, sizes, topk, 32 ** -0.5, torch.float32)
        monkeypatch.setattr(vsa_ops, "_COARSE_VARIANT", "twophase")
        got = vsa_ops.vsa_select(qc, kc, vc, sizes, topk, 32 ** -0.5, torch.float32)
        torch.testing.assert_close(got[0], want[0], **TOL)
        assert torch.equal(got[2], want[2]) and got[1].shape == want[1].shape
        if topk >= 21:
            assert torch.equal(got[1], want[1])
        else:  # 64-column default tile vs the one-pass's 32: compare with the reference selection
            ref_scores = coarse_attention_reference(qc, kc, vc, sizes, 32 ** -0.5)[2]
            assert torch.equal(got[1].long(), topk_indices_reference(ref_scores, topk))


class _RecordingSide:
    """A stand-in for vsa_ops._SideStream: records when it is entered, left and joined, and which
    kernels were launched inside it (by wrapping the two launch objects' ``__getitem__``)."""

    def __init__(self, events):
        self.events = events

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, *exc):
        self.events.append("exit")
        return False

    def join(self):
        self.events.append("join")


@pytest.mark.parametrize("topk", [3, 40])
def test_side_hook_runs_phase2_inside_and_joins_after_the_topk(monkeypatch, topk):
    """vsa_select_fwd(side=): phase 2 is launched inside the side context, phase 1 before it, the
    top-k after it and ``join()`` last; the results are those of the call without ``side``."""
    from fastvideo_cute.kernels.triton import vsa_coarse_fwd2 as cf2
    from fastvideo_cute.kernels.triton import vsa_select as vs

    events = []
    for mod, name, tag in ((cf2, "_coarse_fwd2_scores_kernel", "phase1"), (cf2, "_coarse_fwd2_out_kernel", "phase2"),
                           (vs, "_vsa_topk_rows_kernel", "topk"), (vs, "_vsa_topk_kernel", "topk")):
        kernel = getattr(mod, name)

        class _Tagged:
            def __init__(self, kernel, tag):
                self.kernel, self.tag = kernel, tag

            def __getitem__(self, grid):
                events.append(self.tag)
                return self.kernel[grid]

        monkeypatch.setattr(mod, name, _Tagged(kernel, tag))
    qc, kc, vc = _means(1, 2, 9, 40, 32, seed=31)
    sizes = _sizes(*KV40)
    want = _run(qc, kc, vc, sizes, topk)
    events.clear()
    got = _run(qc, kc, vc, sizes, topk, side=_RecordingSide(events))
    assert events == ["phase1", "enter", "phase2", "exit", "topk", "join"]
    assert all(torch.equal(x, y) for x, y in zip(got, want) if x is not None)


def test_default_tiles_and_scratch_size():
    assert "twophase" in COARSE_VARIANTS and "onepass" in COARSE_VARIANTS
    assert FWD2_PRECISIONS == COARSE_PRECISIONS  # restated in vsa_coarse_fwd2 (no import cycle)
    for d in (8, 16, 24, 48, 64, 100, 128, 256):
        for cfg in coarse_fwd2_tiles(d):
            bq, bkv, bd, warps, stages = cfg
            for x in (bq, bkv, bd):
                assert x >= 16 and x & (x - 1) == 0, (d, cfg)
            assert warps in (1, 2, 4, 8, 16) and (stages is None or stages >= 1)
        assert coarse_fwd2_tiles(d)[0][2] >= d  # phase 1: one dot over all of D
    assert coarse_fwd2_scratch_numel(1, 24, 1800, 1800, 128) == 24 * 1800 * 29 * 2  # 64-column tiles
    assert coarse_fwd2_scratch_numel(2, 3, 5, 40, 32, ((16, 16, None, 4), None)) == 2 * 3 * 5 * 3 * 2
    assert resolve_fwd2_tiles(((None, 32, None, 2), (16, None, 16, None, 1)), 64) == \
        ((64, 32, 64, 2, None), (16, 32, 16, 2, 1))  # unset entries: phase 2's defaults 32 x 32, 2 warps


def test_direct_helper_checks_precision_and_writes_everything():
    """vsa_coarse_fwd2 called directly (no top-k): a bad precision is a ValueError; the result
    equals what vsa_select_fwd gives through coarse_variant="twophase"."""
    qc, kc, vc = _means(1, 1, 7, 20, 32, seed=40)
    sizes = _sizes(*([3, 0] * 10))
    bufs = [torch.full((1, 1, 7, 32), NAN, device=DEV), torch.full((1, 1, 7), NAN, device=DEV),
            torch.full((1, 1, 7, 20), NAN, device=DEV), torch.full((coarse_fwd2_scratch_numel(1, 1, 7, 20, 32),),
                                                                   NAN, device=DEV)]
    with pytest.raises(ValueError, match="precision"):
        vsa_coarse_fwd2(qc, kc, vc, sizes, bufs[0], None, bufs[1], bufs[2], bufs[3], sm_scale=0.2, precision="fp16")
    vsa_coarse_fwd2(qc, kc, vc, sizes, bufs[0], None, bufs[1], bufs[2], bufs[3], sm_scale=0.2)
    want = _run(qc, kc, vc, sizes, topk=3, sm_scale=0.2)
    assert torch.equal(bufs[0], want[0]) and torch.equal(bufs[1], want[2]) and torch.equal(bufs[2], want[5])


@pytest.mark.parametrize("kw,match", [
    (dict(partial_scratch=None), "partial_scratch"),
    (dict(partial_scratch="small"), "partial_scratch"),
    (dict(partial_scratch="fp16"), "partial_scratch"),
    (dict(scores=None), "needs scores"),
    (dict(scores="shape"), "needs scores"),
    (dict(tiles=(16, 16, None, 4)), "phase_tiles"),
    (dict(kv_splits=2), "phase_tiles"),
    (dict(num_stages=2), "phase_tiles"),
    (dict(coarse_variant="onepass", phase_tiles=((16, 16, None, 4), None)), "for coarse_variant='twophase'"),
    (dict(coarse_variant="onepass", partial_scratch="ok"), "for coarse_variant='twophase'"),
    (dict(coarse_variant="onepass", side=contextlib.nullcontext()), "for coarse_variant='twophase'"),
    (dict(coarse_variant="fast"), "coarse_variant must be"),
    (dict(phase_tiles=((8, 16, None, 4), None)), "BLOCK_Q=8"),
    (dict(phase_tiles=((16, 16, 16, 4), None)), "BLOCK_D=16 < head_dim"),
    (dict(phase_tiles=(None, (16, 24, 16, 4))), "BLOCK_KV=24"),
    (dict(phase_tiles=(None, (16, 16, 16, 3))), "num_warps"),
    (dict(phase_tiles=(None, (16, 16, 16, 4, 0))), "num_stages"),
    (dict(phase_tiles=((16, 16, None, 4),)), "phase_tiles must be"),
    (dict(phase_tiles=((16, 16), None)), r"phase_tiles\[0\]"),
])
@pytest.mark.parametrize("topk", [2, 6])
def test_twophase_bad_arguments(kw, match, topk):
    qc, kc, vc = _means(1, 1, 3, 6, 32, seed=24)
    k = min(topk, 6)
    full = coarse_fwd2_scratch_numel(1, 1, 3, 6, 32)
    kw = dict(kw)
    given = {"small": torch.empty(full - 1, device=DEV), "fp16": torch.empty(full, dtype=torch.float16, device=DEV),
             "ok": torch.empty(full, device=DEV)}
    args = dict(coarse_variant="twophase", scores=torch.empty(1, 1, 3, 6, device=DEV),
                partial_scratch=given["ok"])
    args.update(kw)
    if isinstance(args["partial_scratch"], str):
        args["partial_scratch"] = given[args["partial_scratch"]]
    if isinstance(args["scores"], str):  # "shape": a wrong one
        args["scores"] = torch.empty(1, 1, 3, 7, device=DEV)
    if args["coarse_variant"] == "onepass" and k == 6:
        args["scores"] = None
    scores = args.pop("scores")
    outs = (torch.empty_like(qc), None, torch.empty(1, 1, 3, device=DEV),
            torch.empty(1, 1, 3, k, dtype=torch.int32, device=DEV), torch.empty(1, 1, 3, dtype=torch.int32, device=DEV))
    with pytest.raises(ValueError, match=match):
        vsa_select_fwd(qc, kc, vc, _sizes(*([2] * 6)), *outs, scores, topk=topk, sm_scale=0.25, **args)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_side_stream_gives_the_same_bits_and_graph_replays_it(monkeypatch):
    """vsa_ops.vsa_select with phase 2 on the side stream (_COARSE_OVERLAP, the default) against the
    same call on one stream, at Wan-1.3B 480p's size (H=12, 624 blocks, top-k 78, bf16 out_c and
    the fp32 copy the backward keeps): bitwise the same out_c / LSE / lists, repeated (a missing
    join would let the next launch read a half-written out_c); then captured in a CUDA graph and
    replayed on new means, again bitwise equal to the eager one-stream call."""
    monkeypatch.setattr(vsa_ops, "_COARSE_VARIANT", "twophase")
    g = torch.Generator(device="cuda").manual_seed(5)
    h, n, d = 12, 624, 128
    sizes = torch.randint(0, 65, (n,), device="cuda", generator=g, dtype=torch.int32)
    sizes[::40] = 0

    def means():
        return [torch.randn(1, h, n, d, device="cuda", generator=g) for _ in range(3)]

    def call(qc, kc, vc, overlap):
        monkeypatch.setattr(vsa_ops, "_COARSE_OVERLAP", overlap)
        out = vsa_ops._select_impl(qc, kc, vc, sizes, 78, d ** -0.5, torch.bfloat16, True)
        return [x.clone() for x in out]

    qc, kc, vc = means()
    want = call(qc, kc, vc, False)
    for _ in range(3):
        got = call(qc, kc, vc, True)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    static = means()
    monkeypatch.setattr(vsa_ops, "_COARSE_OVERLAP", True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            vsa_ops._select_impl(*static, sizes, 78, d ** -0.5, torch.bfloat16, True)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = vsa_ops._select_impl(*static, sizes, 78, d ** -0.5, torch.bfloat16, True)
    for _ in range(2):
        fresh = means()
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        want = call(*fresh, False)
        assert all(torch.equal(a, b) for a, b in zip(captured, want))
