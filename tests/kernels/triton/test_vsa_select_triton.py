"""Fused selection kernels (``kernels/triton/vsa_select.py``, ``vsa_coarse_bwd.py``) against the
fp32 references (``coarse_attention_reference``, ``topk_indices_reference``) and against the
library's own selection (``topk_block_map`` + ``map_to_index``), the latter exactly.

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py). Shapes are small: Qb below
one 32-row tile (masked rows), KVb above one 32-column chunk (two chunks), B = H = 2; the
backward's shape tests add Qb != KVb, sizes that are not multiples of the tiles, head_dim 24, 48,
64, 256 and overridden (smaller) tiles so that both phases walk several chunks.

Tolerances: ``out_c``/``lse``/scores are fp32 dots in another summation order than torch's
matmul: measured max abs error 3e-7 / 5e-7 / 6e-7 on these shapes, so 1e-5 is headroom. The
backward's gradients (both paths, the two-phase kernel and the fused fallback, every shape here,
fp32 or fp16 dout, the LSE -inf rows): measured max abs error 2.7e-7 to 1.7e-6 (the largest at
head_dim 256) against fp32 autograd, gradients up to ~3.5 in magnitude, so TOL (atol 1e-5 + rtol
1e-5 * |ref|) is >= 6x headroom; the
P scratch against torch's softmax: 1.5e-7 (values <= 1). With an fp16 ``out_c`` the cast is one fp16 rounding
(rel 2^-11 = 4.9e-4): rtol 1e-3. The top-k is compared exactly (``torch.equal``) whenever both
sides see the same scores: the kernel's own scores scratch, or integer-valued inputs whose scores
every summation order gives exactly.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.api import topk_block_map  # noqa: E402
from fastvideo_cute.kernels.triton.vsa_coarse_bwd import (COARSE_BWD_PHASES, coarse_bwd_tiles,  # noqa: E402
                                                          vsa_coarse_bwd)
from fastvideo_cute.kernels.triton.vsa_select import (coarse_split_scratch_numel, parse_topk_variant,  # noqa: E402
                                                      topk_chunks, vsa_select_fwd, vsa_topk)
from fastvideo_cute.metadata import map_to_index  # noqa: E402
from fastvideo_cute.reference import coarse_attention_reference, topk_indices_reference  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
TOL = dict(atol=1e-5, rtol=1e-5)


def _means(b, h, qb, kvb, d, seed=0, integer=False):
    g = torch.Generator().manual_seed(seed)
    if integer:  # small integers: every dot product (and its scaling by a power of two) is exact
        mk = lambda n: torch.randint(-2, 3, (b, h, n, d), generator=g).float()  # noqa: E731
    else:
        mk = lambda n: torch.randn(b, h, n, d, generator=g)  # noqa: E731
    return mk(qb).to(DEV), mk(kvb).to(DEV), torch.randn(b, h, kvb, d, generator=g).to(DEV)


def _run(qc, kc, vc, sizes, topk, out_dtype=torch.float32, with_out32=False, sm_scale=None):
    b, h, qb, d = qc.shape
    kvb = kc.shape[2]
    k = min(topk, kvb)
    sm_scale = d ** -0.5 if sm_scale is None else sm_scale
    out = torch.empty(b, h, qb, d, dtype=out_dtype, device=DEV)
    out32 = torch.empty(b, h, qb, d, device=DEV) if with_out32 else None
    lse = torch.empty(b, h, qb, device=DEV)
    idx = torch.full((b, h, qb, k), -1, dtype=torch.int32, device=DEV)
    num = torch.full((b, h, qb), -1, dtype=torch.int32, device=DEV)
    scores = torch.full((b, h, qb, kvb), float("nan"), device=DEV) if k < kvb else None
    vsa_select_fwd(qc, kc, vc, sizes, out, out32, lse, idx, num, scores, topk=topk, sm_scale=sm_scale)
    return out, out32, lse, idx, num, scores


def _sizes(*vals):
    return torch.tensor(vals, dtype=torch.int32, device=DEV)


KV_SIZES = [16, 0, 5, 16] * 10  # 40 kv blocks; every fourth one (from the second) is empty


def test_coarse_attention_and_topk_match_reference():
    qc, kc, vc = _means(2, 2, 5, 40, 32)
    sizes = _sizes(*KV_SIZES)
    out, out32, lse, idx, num, scores = _run(qc, kc, vc, sizes, topk=7, with_out32=True)
    ref_out, ref_lse, ref_scores = coarse_attention_reference(qc, kc, vc, sizes)
    torch.testing.assert_close(out, ref_out, **TOL)
    assert torch.equal(out32, out)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    empty = (sizes == 0).expand_as(scores)
    assert torch.isneginf(scores[empty]).all() and torch.isfinite(scores[~empty]).all()
    torch.testing.assert_close(scores[~empty], ref_scores[~empty], **TOL)
    # selection: exactly what the library's sort-based map gives on the same scores
    assert torch.equal(num, torch.full_like(num, 7))
    assert torch.equal(idx.long(), topk_indices_reference(scores, 7))
    map_idx, map_num = map_to_index(topk_block_map(scores, 7))
    assert torch.equal(map_num, num) and torch.equal(map_idx[..., :7], idx)
    assert not torch.isin(idx, torch.nonzero(sizes == 0).flatten().to(torch.int32)).any()  # 30 non-empty > 7


def test_fp16_out_and_ties_on_exact_scores():
    """Integer means (D=16, scale 1/4): scores are exact, with many ties; the selection must be
    topk_block_map's on the reference's own scores, bit for bit."""
    qc, kc, vc = _means(2, 2, 6, 37, 16, seed=3, integer=True)
    sizes = _sizes(*([9] * 37))
    out, out32, lse, idx, num, scores = _run(qc, kc, vc, sizes, topk=5, out_dtype=torch.float16, with_out32=True)
    ref_out, ref_lse, ref_scores = coarse_attention_reference(qc, kc, vc, sizes)
    assert torch.equal(scores, ref_scores)
    map_idx, _ = map_to_index(topk_block_map(ref_scores, 5))
    assert torch.equal(idx, map_idx[..., :5])
    ties = (ref_scores.unsqueeze(-1) == ref_scores.unsqueeze(-2)).sum() > ref_scores.numel()
    assert ties  # the case does exercise ties
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), ref_out, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(out32, ref_out, **TOL)


def test_topk_at_least_kvb_takes_every_block_in_order():
    qc, kc, vc = _means(1, 2, 3, 5, 32, seed=5)
    sizes = _sizes(4, 0, 4, 4, 1)
    for topk in (5, 9):
        out, _, lse, idx, num, scores = _run(qc, kc, vc, sizes, topk=topk)
        assert scores is None and idx.shape[-1] == 5
        assert torch.equal(idx, torch.arange(5, dtype=torch.int32, device=DEV).expand_as(idx))
        assert (num == 5).all()
        torch.testing.assert_close(out, coarse_attention_reference(qc, kc, vc, sizes)[0], **TOL)


def test_all_kv_blocks_empty():
    """Nothing to attend to: out_c 0, lse -inf; the top-k of an all -inf row is its first k blocks."""
    qc, kc, vc = _means(1, 1, 4, 6, 32, seed=6)
    sizes = _sizes(0, 0, 0, 0, 0, 0)
    out, _, lse, idx, num, scores = _run(qc, kc, vc, sizes, topk=2)
    assert (out == 0).all() and torch.isneginf(lse).all() and torch.isneginf(scores).all()
    assert torch.equal(idx, torch.tensor([0, 1], dtype=torch.int32, device=DEV).expand_as(idx))


def test_nan_row_propagates_and_is_selected_first():
    qc, kc, vc = _means(1, 1, 3, 6, 32, seed=8)
    qc[0, 0, 1, 3] = float("nan")  # q block 1: a NaN mean -> a NaN scores row
    kc[0, 0, 4, 0] = float("nan")  # kv block 4: a NaN column in every row
    sizes = _sizes(2, 2, 2, 2, 2, 2)
    out, _, lse, idx, num, scores = _run(qc, kc, vc, sizes, topk=3)
    assert torch.isnan(out).all() and torch.isnan(lse).all()  # softmax over a NaN: NaN, as torch
    assert torch.equal(idx[0, 0, 1], torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV))
    assert (idx[0, 0, [0, 2]] == 4).any(dim=-1).all()  # the NaN column is taken
    assert torch.equal(idx.long(), topk_indices_reference(scores, 3))
    assert torch.equal(idx, map_to_index(topk_block_map(scores, 3))[0][..., :3])


def _topk(scores, topk):
    k = min(topk, scores.shape[-1])
    idx = torch.full(scores.shape[:-1] + (k,), -1, dtype=torch.int32, device=DEV)
    num = torch.full(scores.shape[:-1], -1, dtype=torch.int32, device=DEV)
    vsa_topk(scores.contiguous(), idx, num, topk=topk)
    assert (num == k).all()
    return idx


def test_topk_crafted_rows():
    """Signed zeros tie (as floats), NaNs rank first in index order, +-inf, denormals, all-equal rows."""
    inf, nan, den = float("inf"), float("nan"), 1e-40
    rows = torch.tensor([
        [0.0, -0.0, 0.0, -0.0, 1.0, -0.0, 0.0, 0.0, -1.0, 0.0],
        [nan, 1.0, nan, inf, -inf, nan, 2.0, 2.0, 0.5, nan],
        [den, -den, 0.0, 2 * den, -0.0, den, -2 * den, 0.0, den, -den],
        [3.0] * 10,
        [-inf] * 10,
        [-inf, inf, -inf, 5.0, inf, -inf, -3.0, inf, -inf, 0.0],
    ], device=DEV)
    for topk in (1, 3, 4, 9):
        idx = _topk(rows, topk)
        want = torch.sort(rows, dim=-1, descending=True, stable=True).indices[..., :topk].sort(-1).values
        assert torch.equal(idx.long(), want), topk
        assert torch.equal(idx.long(), topk_indices_reference(rows, topk)), topk
    assert _topk(rows, 3)[0].tolist() == [0, 1, 4]  # 1.0, then +0.0 and -0.0 (a tie) by index
    assert _topk(rows, 3)[1].tolist() == [0, 2, 5]  # three NaNs


@pytest.mark.parametrize("cols", [1, 17, 1181])
def test_topk_random_rows_with_heavy_ties(cols):
    """Non-power-of-two widths up to a Wan-14B 720p row (~1180 kv blocks); values from a small
    set, so most entries tie."""
    g = torch.Generator().manual_seed(cols)
    rows = (torch.randint(-4, 5, (3, cols), generator=g).float() / 4).to(DEV)
    for topk in sorted({1, max(1, cols // 8), cols}):
        assert torch.equal(_topk(rows, topk).long(), topk_indices_reference(rows, topk))
        assert torch.equal(_topk(rows, topk), map_to_index(topk_block_map(rows, topk))[0][..., :topk])


# ---------------------------------------------------------------- tuning variants (bench_glue.py sweeps them)

TOPK_VARIANTS = ["rows1w1", "rows1w1x", "rows4w2x", "rows2w1"]


def _topk_v(scores, topk, variant):
    k = min(topk, scores.shape[-1])
    idx = torch.full(scores.shape[:-1] + (k,), -1, dtype=torch.int32, device=DEV)
    num = torch.full(scores.shape[:-1], -1, dtype=torch.int32, device=DEV)
    vsa_topk(scores.contiguous(), idx, num, topk=topk, variant=variant)
    return idx, num


@pytest.mark.parametrize("variant", TOPK_VARIANTS)
def test_topk_variants_equal_the_one_row_kernel(variant):
    """Every variant gives search32's lists exactly (and the stable-sort reference's): signed
    zeros, NaNs, +-inf, denormals, all-equal and all -inf rows, heavy ties; k = 1, k < KVb,
    k == KVb; row counts that leave the last program partly empty (7 rows, 4 per program)."""
    inf, nan, den = float("inf"), float("nan"), 1e-40
    g = torch.Generator().manual_seed(21)
    crafted = torch.tensor([
        [0.0, -0.0, 0.0, -0.0, 1.0, -0.0, 0.0, 0.0, -1.0, 0.0],
        [nan, 1.0, nan, inf, -inf, nan, 2.0, 2.0, 0.5, nan],
        [den, -den, 0.0, 2 * den, -0.0, den, -2 * den, 0.0, den, -den],
        [3.0] * 10,
        [-inf] * 10,
        [-inf, inf, -inf, 5.0, inf, -inf, -3.0, inf, -inf, 0.0],
        [-nan, 1.0, -2.0, nan, -inf, 0.0, -0.0, 7.0, -7.0, 1e30],
    ], device=DEV)
    ties = (torch.randint(-4, 5, (5, 37), generator=g).float() / 4).to(DEV)
    wide = torch.randn(3, 70, generator=g).to(DEV)  # two 64-lane chunks: 64 + 16 lanes (tail partly padding)
    for rows in (crafted, ties, wide):
        cols = rows.shape[-1]
        for topk in sorted({1, 3, max(1, cols // 8), cols - 1, cols, cols + 5}):
            want_idx, want_num = _topk_v(rows, topk, "search32")
            got_idx, got_num = _topk_v(rows, topk, variant)
            assert torch.equal(got_idx, want_idx) and torch.equal(got_num, want_num), (cols, topk)
            assert torch.equal(got_idx.long(), topk_indices_reference(rows, topk)), (cols, topk)


def test_topk_variant_names_and_chunks():
    assert parse_topk_variant("search32") is None
    assert parse_topk_variant("rows4w2x") == (4, 2, True) and parse_topk_variant("rows1w1") == (1, 1, False)
    for bad in ("rows3w1", "rows4w3", "rows", "fast", "rows4w4y"):
        with pytest.raises(ValueError, match="topk variant"):
            parse_topk_variant(bad)
    assert topk_chunks(624) == (512, 128) and topk_chunks(1440) == (1024, 512) and topk_chunks(512) == (256, 256)
    for kvb in (1, 5, 16, 17, 40, 100, 624, 1181, 16384):
        main, tail = topk_chunks(kvb)
        assert main + tail >= kvb and main >= 16 and tail >= 16 and not main & (main - 1) and not tail & (tail - 1)


COARSE_OVERRIDES = [
    dict(kv_splits=2),
    dict(kv_splits=3, tiles=(16, 16, None, 4)),  # splits of 1, 1 and 1 chunk of 16 over 40 columns
    dict(kv_splits=4, tiles=(16, 32, None, 4)),  # 2 chunks over 4 splits: two splits are empty
    dict(tiles=(64, 16, None, 4), num_stages=2),
]


@pytest.mark.parametrize("kw", COARSE_OVERRIDES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_coarse_overrides_match_reference_and_keep_the_selection(kw):
    """Other tiles / kv splits: out_c, out32, lse and scores within TOL of the fp32 reference (and
    of the default kernel), the top-k lists exactly those of the kernel's own scores; the split
    scratch is NaN-filled (everything the combine reads must have been written)."""
    qc, kc, vc = _means(2, 2, 5, 40, 32, seed=22)
    sizes = _sizes(*KV_SIZES)
    kw = dict(kw)
    if kw.get("kv_splits", 1) > 1:
        kw["split_scratch"] = torch.full((coarse_split_scratch_numel(2, 2, 5, 32, kw["kv_splits"]),), float("nan"),
                                         device=DEV)
    b, h, qb, d = qc.shape
    out, out32, lse = (torch.empty(b, h, qb, d, device=DEV), torch.empty(b, h, qb, d, device=DEV),
                       torch.empty(b, h, qb, device=DEV))
    idx = torch.empty(b, h, qb, 7, dtype=torch.int32, device=DEV)
    num = torch.empty(b, h, qb, dtype=torch.int32, device=DEV)
    scores = torch.empty(b, h, qb, 40, device=DEV)
    vsa_select_fwd(qc, kc, vc, sizes, out, out32, lse, idx, num, scores, topk=7, sm_scale=d ** -0.5, **kw)
    ref_out, ref_lse, ref_scores = coarse_attention_reference(qc, kc, vc, sizes)
    default = _run(qc, kc, vc, sizes, topk=7, with_out32=True)
    for got, want in ((out, ref_out), (out32, ref_out), (lse, ref_lse), (out, default[0]), (lse, default[2])):
        torch.testing.assert_close(got, want, **TOL)
    empty = (sizes == 0).expand_as(scores)
    assert torch.isneginf(scores[empty]).all()
    torch.testing.assert_close(scores[~empty], ref_scores[~empty], **TOL)
    assert torch.equal(idx.long(), topk_indices_reference(scores, 7)) and (num == 7).all()


@pytest.mark.parametrize("splits", [2, 3])
def test_coarse_split_empty_and_nan_rows(splits):
    """The combine keeps the epilogue's contract: all kv blocks empty -> out_c 0, lse -inf; a NaN
    row stays NaN."""
    qc, kc, vc = _means(1, 1, 3, 40, 32, seed=23)
    scratch = torch.full((coarse_split_scratch_numel(1, 1, 3, 32, splits),), float("nan"), device=DEV)
    k = dict(kv_splits=splits, split_scratch=scratch, tiles=(16, 16, None, 4))
    out, lse = torch.empty_like(qc), torch.empty(1, 1, 3, device=DEV)
    idx, num = torch.empty(1, 1, 3, 2, dtype=torch.int32, device=DEV), torch.empty(1, 1, 3, dtype=torch.int32, device=DEV)
    scores = torch.empty(1, 1, 3, 40, device=DEV)
    vsa_select_fwd(qc, kc, vc, _sizes(*([0] * 40)), out, None, lse, idx, num, scores, topk=2, sm_scale=0.25, **k)
    assert (out == 0).all() and torch.isneginf(lse).all()
    qc[0, 0, 1, 3] = float("nan")
    vsa_select_fwd(qc, kc, vc, _sizes(*KV_SIZES), out, None, lse, idx, num, scores, topk=2, sm_scale=0.25, **k)
    assert torch.isnan(out[0, 0, 1]).all() and torch.isnan(lse[0, 0, 1])
    assert torch.isfinite(out[0, 0, [0, 2]]).all() and torch.isfinite(lse[0, 0, [0, 2]]).all()


@pytest.mark.parametrize("kw,match", [
    (dict(kv_splits=2), "split_scratch"),
    (dict(kv_splits=2, split_scratch="small"), "split_scratch"),
    (dict(kv_splits=0), "kv_splits"),
    (dict(tiles=(8, 32, None, 4)), "BLOCK_Q=8"),
    (dict(tiles=(16, 32, 16, 4)), "BLOCK_D=16"),
    (dict(tiles=(16, 32, None, 3)), "num_warps"),
    (dict(tiles=(16, 32)), "tiles must be"),
    (dict(topk_variant="rows3w1"), "topk variant"),
])
def test_select_overrides_bad_arguments(kw, match):
    qc, kc, vc = _means(1, 1, 3, 6, 32, seed=24)
    if kw.get("split_scratch") == "small":
        kw = dict(kw, split_scratch=torch.empty(10, device=DEV))
    args = (torch.empty_like(qc), None, torch.empty(1, 1, 3, device=DEV),
            torch.empty(1, 1, 3, 2, dtype=torch.int32, device=DEV), torch.empty(1, 1, 3, dtype=torch.int32, device=DEV),
            torch.empty(1, 1, 3, 6, device=DEV))
    with pytest.raises(ValueError, match=match):
        vsa_select_fwd(qc, kc, vc, _sizes(*([2] * 6)), *args, topk=2, sm_scale=0.25, **kw)


BWD_PATHS = ["two_phase", "fused"]  # with p/ds scratch (the op's path) / without (the one-launch fallback)


def _bwd(qc, kc, vc, sizes, out32, lse, dout, path="two_phase", tiles=None, scratch_out=None):
    d = [torch.full_like(x, float("nan")) for x in (qc, kc, vc)]  # every element must be written
    kw = {}
    if path == "two_phase":  # NaN-filled too: what phase B reads must be what phase A wrote
        b, h, qb, _ = qc.shape
        kw = {name: torch.full((b, h, qb, kc.shape[2]), float("nan"), device=DEV)
              for name in ("p_scratch", "ds_scratch")}
    vsa_coarse_bwd(qc, kc, vc, sizes, dout, out32, lse, *d, sm_scale=qc.shape[-1] ** -0.5, tiles=tiles, **kw)
    if scratch_out is not None:
        scratch_out.update(kw)
    return d


def _bwd_reference(qc, kc, vc, sizes, dout):
    """fp32 autograd of coarse_attention_reference."""
    leaves = [x.clone().requires_grad_(True) for x in (qc, kc, vc)]
    ref_out = coarse_attention_reference(*leaves, sizes)[0]
    return torch.autograd.grad(ref_out, leaves, dout.float())


@pytest.mark.parametrize("path", BWD_PATHS)
@pytest.mark.parametrize("dout_dtype", [torch.float32, torch.float16])
def test_coarse_backward_matches_autograd_of_reference(dout_dtype, path):
    qc, kc, vc = _means(2, 2, 5, 40, 32, seed=9)
    sizes = _sizes(*KV_SIZES)
    _, out32, lse, _, _, _ = _run(qc, kc, vc, sizes, topk=3, with_out32=True)
    g = torch.Generator().manual_seed(10)
    dout = torch.randn(qc.shape, generator=g).to(DEV, dout_dtype)
    scratch = {}
    got = _bwd(qc, kc, vc, sizes, out32, lse, dout, path, scratch_out=scratch)
    want = _bwd_reference(qc, kc, vc, sizes, dout)
    for name, a, w in zip(("dqc", "dkc", "dvc"), got, want):
        torch.testing.assert_close(a, w, **TOL, msg=name)
    empty = sizes == 0
    assert (got[1][:, :, empty] == 0).all() and (got[2][:, :, empty] == 0).all()
    if scratch:  # the scratch holds P (the reference's softmax; exactly 0 at empty kv blocks) and dS
        ref_p = torch.softmax(coarse_attention_reference(qc, kc, vc, sizes)[2], dim=-1)
        torch.testing.assert_close(scratch["p_scratch"], ref_p, **TOL)
        assert (scratch["p_scratch"][..., empty] == 0).all() and (scratch["ds_scratch"][..., empty] == 0).all()
        assert torch.isfinite(scratch["ds_scratch"]).all()
    again = _bwd(qc, kc, vc, sizes, out32, lse, dout, path)
    assert all(torch.equal(a, b) for a, b in zip(got, again))  # deterministic


# (Qb, KVb, head_dim, kv sizes, tiles): Qb != KVb, neither a multiple of the tiles (masked rows and
# columns in the last tile of both phases), head_dim 64, non-powers of two 48 and 24 (masked lanes),
# 256 (its default tiles), overridden tiles giving several q and kv chunks on these small sizes.
SHAPES = [
    (37, 45, 64, [3, 0, 7] * 15, None),
    (45, 19, 48, [0, 2, 5, 0] * 4 + [1, 1, 0], {"a": (16, 16, None, 4), "b": (16, 16, None, 4),
                                                 "fused": (16, 16, None, 4)}),
    (21, 70, 24, [1, 0] * 35, ((16, 32, None, 4), {"BLOCK_Q": 32, "BLOCK_KV": 16}, (16, 16, 32, 2))),
    (5, 20, 256, [4] * 19 + [0], None),
]


@pytest.mark.parametrize("path", BWD_PATHS)
@pytest.mark.parametrize("qb,kvb,d,kv_sizes,tiles", SHAPES, ids=[f"{s[0]}x{s[1]}xd{s[2]}" for s in SHAPES])
def test_coarse_backward_shapes_and_tiles(qb, kvb, d, kv_sizes, tiles, path):
    qc, kc, vc = _means(1, 2, qb, kvb, d, seed=qb + kvb)
    sizes = _sizes(*kv_sizes)
    _, out32, lse, _, _, _ = _run(qc, kc, vc, sizes, topk=kvb, with_out32=True)
    dout = torch.randn(qc.shape, generator=torch.Generator().manual_seed(d)).to(DEV)
    got = _bwd(qc, kc, vc, sizes, out32, lse, dout, path, tiles)
    for name, a, w in zip(("dqc", "dkc", "dvc"), got, _bwd_reference(qc, kc, vc, sizes, dout)):
        torch.testing.assert_close(a, w, **TOL, msg=name)
    again = _bwd(qc, kc, vc, sizes, out32, lse, dout, path, tiles)
    assert all(torch.equal(a, b) for a, b in zip(got, again))  # deterministic


@pytest.mark.parametrize("path", BWD_PATHS)
def test_coarse_backward_all_empty_is_zero(path):
    """Every kv block empty (Qb, KVb not multiples of the tiles): LSE -inf on every row, so P = 0:
    every gradient exactly 0, and no NaN anywhere (gradients and scratch)."""
    qc, kc, vc = _means(1, 1, 35, 37, 32, seed=12)
    sizes = _sizes(*([0] * 37))
    _, out32, lse, _, _, _ = _run(qc, kc, vc, sizes, topk=1, with_out32=True)
    assert torch.isneginf(lse).all()
    scratch = {}
    got = _bwd(qc, kc, vc, sizes, out32, lse, torch.randn(qc.shape, device=DEV), path, scratch_out=scratch)
    assert all((x == 0).all() for x in got)
    assert all((x == 0).all() for x in scratch.values())


@pytest.mark.parametrize("path", BWD_PATHS)
def test_coarse_backward_neg_inf_lse_rows_get_no_gradient(path):
    """The kernel's contract for a row with LSE -inf (what the forward writes when the row has no
    kv block): its P is 0, so its dqc is exactly 0 and it adds nothing to dkc/dvc, even with a
    non-zero dout and out_c there. Reference: autograd with that row's dout zeroed. Rows 0, 17, 36
    of Qb = 37: the first row, one inside the second q tile, the last (masked-tile) row."""
    qc, kc, vc = _means(1, 2, 37, 45, 32, seed=14)
    sizes = _sizes(*([3, 0, 7] * 15))
    _, out32, lse, _, _, _ = _run(qc, kc, vc, sizes, topk=45, with_out32=True)
    rows = [0, 17, 36]
    lse[:, :, rows] = float("-inf")
    dout = torch.randn(qc.shape, generator=torch.Generator().manual_seed(15)).to(DEV)
    scratch = {}
    got = _bwd(qc, kc, vc, sizes, out32, lse, dout, path, scratch_out=scratch)
    dout_ref = dout.clone()
    dout_ref[:, :, rows] = 0
    for name, a, w in zip(("dqc", "dkc", "dvc"), got, _bwd_reference(qc, kc, vc, sizes, dout_ref)):
        torch.testing.assert_close(a, w, **TOL, msg=name)
    assert (got[0][:, :, rows] == 0).all()
    assert all(torch.isfinite(x).all() for x in got + list(scratch.values()))
    if scratch:
        assert (scratch["p_scratch"][:, :, rows] == 0).all() and (scratch["ds_scratch"][:, :, rows] == 0).all()


def test_coarse_backward_paths_agree_bitwise_with_the_same_tiles():
    """Phase A computes dqc exactly as the fused kernel's q side: equal bits with equal q tiles
    under the interpreter. (dkc/dvc are summed from the same P/dS tiles in the same order too, but through a stored
    and reloaded tile: compared to the TOL bound only.)"""
    qc, kc, vc = _means(2, 1, 21, 40, 32, seed=16)
    sizes = _sizes(*KV_SIZES)
    _, out32, lse, _, _, _ = _run(qc, kc, vc, sizes, topk=40, with_out32=True)
    dout = torch.randn(qc.shape, generator=torch.Generator().manual_seed(17)).to(DEV)
    tiles = {"a": (16, 32, None, 4), "b": (16, 32, None, 4), "fused": (16, 32, None, 4)}
    two = _bwd(qc, kc, vc, sizes, out32, lse, dout, "two_phase", tiles)
    fused = _bwd(qc, kc, vc, sizes, out32, lse, dout, "fused", tiles)
    if HAS_CUDA:  # two different compiled kernels: same arithmetic, equal bits not promised
        torch.testing.assert_close(two[0], fused[0], **TOL)
    else:
        assert torch.equal(two[0], fused[0])
    for a, b in zip(two[1:], fused[1:]):
        torch.testing.assert_close(a, b, **TOL)


def test_coarse_bwd_default_tiles_are_valid():
    for phase in COARSE_BWD_PHASES:
        for d in (8, 16, 24, 48, 64, 100, 128, 256):
            bq, bkv, bd, warps = coarse_bwd_tiles(phase, d)
            for x in (bq, bkv, bd):
                assert x >= 16 and x & (x - 1) == 0, (phase, d)
            assert bd >= d and warps in (1, 2, 4, 8, 16), (phase, d)


def _bwd_args(qb=5, kvb=6, d=32):
    qc, kc, vc = _means(1, 1, qb, kvb, d, seed=18)
    sizes = _sizes(*([2] * kvb))
    _, out32, lse, _, _, _ = _run(qc, kc, vc, sizes, topk=kvb, with_out32=True)
    grads = [torch.empty_like(x) for x in (qc, kc, vc)]
    return (qc, kc, vc, sizes, torch.zeros_like(qc), out32, lse, *grads)


@pytest.mark.parametrize("kw,match", [
    (dict(p_scratch="shape"), "both or neither"),
    (dict(p_scratch="shape", ds_scratch=(1, 1, 5, 7)), "ds_scratch"),
    (dict(p_scratch=(1, 1, 6, 6), ds_scratch="shape"), "p_scratch"),
    (dict(p_scratch="shape", ds_scratch="same"), "alias"),
    (dict(tiles={"a": (8, 32, None, 4)}), "BLOCK_Q=8"),
    (dict(tiles={"b": {"BLOCK_D": 16}}), "BLOCK_D=16 < head_dim"),
    (dict(tiles={"c": None}), "unknown phase"),
    (dict(tiles={"a": {"block_q": 16}}), "unknown key"),
    (dict(tiles=((16, 16, None, 3), None)), "num_warps"),
    (dict(tiles=((16, 16, None, 4),)), "cfg_a, cfg_b"),
    (dict(grad_precision="bf16"), "grad_precision"),
])
def test_coarse_backward_bad_arguments(kw, match):
    args = _bwd_args()
    mk = lambda shape: torch.empty(shape, device=DEV)  # noqa: E731
    kw = dict(kw)
    for name in ("p_scratch", "ds_scratch"):
        if kw.get(name) == "shape":
            kw[name] = mk((1, 1, 5, 6))
        elif kw.get(name) == "same":
            kw[name] = kw["p_scratch"]
        elif isinstance(kw.get(name), tuple):
            kw[name] = mk(kw[name])
    if "tiles" in kw and "p_scratch" not in kw:
        kw["p_scratch"], kw["ds_scratch"] = mk((1, 1, 5, 6)), mk((1, 1, 5, 6))
    with pytest.raises(AssertionError, match=match):
        vsa_coarse_bwd(*args, sm_scale=0.25, **kw)


def test_forward_is_deterministic():
    qc, kc, vc = _means(2, 2, 5, 40, 32, seed=13)
    sizes = _sizes(*KV_SIZES)
    a = _run(qc, kc, vc, sizes, topk=6, with_out32=True)
    b = _run(qc, kc, vc, sizes, topk=6, with_out32=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------- GPU, run on the H200

@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["ieee", "tf32x3"])
def test_gpu_wan_14b_720p_rows_exact_topk(precision):
    """Wan2.1-14B 720p-sized coarse rows (H=40, 1180 q and kv blocks, 148 selected, some empty kv
    blocks): the in-kernel top-k equals topk_block_map on the kernel's own scores exactly, and
    out_c matches the reference. Bounds (max abs error, values O(1)): "ieee" 1e-5 (fp32 dots in
    another order, as on CPU); "tf32x3" 1e-4, derived not measured: three TF32 products keep
    ~2^-22 of each fp32 product, over D=128 terms."""
    g = torch.Generator(device="cuda").manual_seed(0)
    h, n, d, topk = 40, 1180, 128, 148
    qc, kc, vc = (torch.randn(1, h, n, d, device="cuda", generator=g) for _ in range(3))
    sizes = torch.randint(0, 65, (n,), device="cuda", generator=g, dtype=torch.int32)
    sizes[::50] = 0
    out = torch.empty(1, h, n, d, device="cuda")
    lse = torch.empty(1, h, n, device="cuda")
    idx = torch.empty(1, h, n, topk, dtype=torch.int32, device="cuda")
    num = torch.empty(1, h, n, dtype=torch.int32, device="cuda")
    scores = torch.empty(1, h, n, n, device="cuda")
    vsa_select_fwd(qc, kc, vc, sizes, out, None, lse, idx, num, scores, topk=topk, sm_scale=d ** -0.5,
                   precision=precision)
    assert (num == topk).all()
    assert torch.equal(idx, map_to_index(topk_block_map(scores, topk))[0][..., :topk])
    ref_out, ref_lse, _ = coarse_attention_reference(qc, kc, vc, sizes)
    tol = 1e-5 if precision == "ieee" else 1e-4
    torch.testing.assert_close(out, ref_out, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, ref_lse, atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["rows1w1", "rows1w1x", "rows2w1x", "rows4w4x", "rows8w4x"])
def test_gpu_topk_variants_equal_search32(variant):
    """Wan-1.3B 480p (624) and Wan-14B 720p (1440) row widths, random scores with ties and -inf
    columns: the compiled variants give search32's lists exactly."""
    g = torch.Generator(device="cuda").manual_seed(1)
    for cols, topk in ((624, 78), (624, 63), (1440, 180)):
        rows = torch.randn(4096, cols, device="cuda", generator=g)
        rows[::7] = torch.round(rows[::7] * 2) / 2  # heavy ties
        rows[:, ::50] = float("-inf")
        want = [torch.empty(4096, topk, dtype=torch.int32, device="cuda"), torch.empty(4096, dtype=torch.int32,
                                                                                      device="cuda")]
        got = [torch.empty_like(want[0]), torch.empty_like(want[1])]
        vsa_topk(rows, *want, topk=topk)
        vsa_topk(rows, *got, topk=topk, variant=variant)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), cols


@pytest.mark.gpu
def test_gpu_coarse_backward_as_the_library_runs_it():
    """The coarse backward with the library's configuration (``vsa_ops._COARSE_BWD_TILES``,
    ``_COARSE_BWD_GRAD_PRECISION``, S at ``_COARSE_PRECISION``) on Wan-1.3B 480p-sized rows (H=12,
    624 q and kv blocks, some kv blocks empty, bf16 dout) against fp64 autograd of the reference:
    max |err| / max |ref| <= 2^-9 per gradient (half a bf16 ulp: the coarse gradients' error stays
    below the rounding of the bf16 gradients they are added into; TF32 products keep ~2^-11 of each)."""
    from fastvideo_cute import vsa_ops

    g = torch.Generator(device="cuda").manual_seed(4)
    h, n, d = 12, 624, 128
    qc, kc, vc = (torch.randn(1, h, n, d, device="cuda", generator=g) for _ in range(3))
    sizes = torch.randint(1, 65, (n,), device="cuda", generator=g, dtype=torch.int32)
    sizes[::40] = 0
    out = torch.empty(1, h, n, d, device="cuda", dtype=torch.bfloat16)
    out32, lse = torch.empty(1, h, n, d, device="cuda"), torch.empty(1, h, n, device="cuda")
    idx = torch.empty(1, h, n, 78, dtype=torch.int32, device="cuda")
    num = torch.empty(1, h, n, dtype=torch.int32, device="cuda")
    scores = torch.empty(1, h, n, n, device="cuda")
    vsa_select_fwd(qc, kc, vc, sizes, out, out32, lse, idx, num, scores, topk=78, sm_scale=d ** -0.5,
                   precision=vsa_ops._COARSE_PRECISION)
    dout = torch.randn(1, h, n, d, device="cuda", generator=g).to(torch.bfloat16)
    got = vsa_ops._select_bwd_impl(dout, qc, kc, vc, sizes, out32, lse, d ** -0.5)
    leaves = [x.double().requires_grad_(True) for x in (qc, kc, vc)]
    ref_out = coarse_attention_reference(*leaves, sizes)[0]
    want = torch.autograd.grad(ref_out, leaves, dout.double())
    for name, a, b in zip(("dqc", "dkc", "dvc"), got, want):
        rel = ((a.double() - b).abs().max() / b.abs().max()).item()
        print(f"\n[coarse bwd {vsa_ops._COARSE_BWD_GRAD_PRECISION or vsa_ops._COARSE_PRECISION}] {name} {rel:.2e}")
        assert rel <= 2.0 ** -9, (name, rel)
