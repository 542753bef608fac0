"""The top-k variants of ``kernels/triton/vsa_topk_radix.py`` (``"bisectw{W}"``: value-space
bisection from the row's min/max; ``"radixw{W}[x]"``: radix select with ``tl.histogram``)
against ``"search32"`` (``_vsa_topk_kernel``) and the stable-sort reference
(``topk_indices_reference``): ``torch.equal`` index lists and counts.

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py), one program per row (the
interpreter ignores num_warps: the warp counts are the GPU test's), so the shapes are a few rows
each: widths below 16 (one 16-lane chunk plus padding), 17 (32 lanes), 70 (64 + 16 lanes, the
second chunk mostly padding), 600 and 624 (512 + 128), 1181 (1024 + 256), 1800 (one chunk of
2048); k = 1, a few, ~KVb/8 (the models' sparsity), KVb - 1, KVb and above (the copy-out path).
search32's lists are computed once per input and k.
Rows: Gaussian scores (the value-space midpoints and the exact-K stop), scores from a few values
(heavy ties at the threshold: the key-space steps), signed zeros, +-inf, NaN (selected first, in
index order), denormals, and bounds that defeat the value midpoint (inf, NaN, 1e30 next to 1e-30).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.kernels.triton.vsa_select import parse_topk_variant, vsa_select_fwd, vsa_topk  # noqa: E402
from fastvideo_cute.kernels.triton.vsa_topk_radix import parse_radix_variant, radix_chunks  # noqa: E402
from fastvideo_cute.reference import topk_indices_reference  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"

VARIANTS = ["bisectw1", "radixw1", "radixw2x"]
_WANT = {}  # (input name, k) -> search32's (idx, num)


def _topk(scores, topk, variant):
    k = min(topk, scores.shape[-1])
    idx = torch.full(scores.shape[:-1] + (k,), -1, dtype=torch.int32, device=scores.device)
    num = torch.full(scores.shape[:-1], -1, dtype=torch.int32, device=scores.device)
    vsa_topk(scores.contiguous(), idx, num, topk=topk, variant=variant)
    return idx, num


def _check(name, rows, topks, variant):
    cols = rows.shape[-1]
    for topk in sorted(set(topks)):
        if (name, topk) not in _WANT:
            _WANT[name, topk] = _topk(rows, topk, "search32")
        want_idx, want_num = _WANT[name, topk]
        got_idx, got_num = _topk(rows, topk, variant)
        assert torch.equal(got_num, want_num) and (got_num == min(topk, cols)).all(), (cols, topk)
        assert torch.equal(got_idx, want_idx), (cols, topk)
        assert torch.equal(got_idx.long(), topk_indices_reference(rows, topk)), (cols, topk)


INF, NAN, DEN = float("inf"), float("nan"), 1e-40
CRAFTED = [
    [0.0, -0.0, 0.0, -0.0, 1.0, -0.0, 0.0, 0.0, -1.0, 0.0],  # signed zeros tie
    [NAN, 1.0, NAN, INF, -INF, NAN, 2.0, 2.0, 0.5, NAN],  # NaNs first, by index
    [DEN, -DEN, 0.0, 2 * DEN, -0.0, DEN, -2 * DEN, 0.0, DEN, -DEN],  # denormals, not flushed
    [3.0] * 10,
    [-INF] * 10,
    [-INF, INF, -INF, 5.0, INF, -INF, -3.0, INF, -INF, 0.0],
    [-NAN, 1.0, -2.0, NAN, -INF, 0.0, -0.0, 7.0, -7.0, 1e30],
    [1e30, 1e-30, -1e-30, 3e-38, 2.0, 1e-30, -1e30, 5e29, 1e-45, -1e-45],  # value midpoints far off
    [1.0, 1.0 + 2 ** -23, 1.0 - 2 ** -24, 1.0, 1.0 + 2 ** -22, 1.0, 1.0, 1.0 - 2 ** -23, 1.0, 1.0],  # one ulp apart
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_crafted_rows_equal_search32(variant):
    """Signed zeros, NaNs, +-inf, denormals, all-equal and all -inf rows, values an ulp apart,
    bounds where the value midpoint is no use; k from 1 to beyond KVb."""
    rows = torch.tensor(CRAFTED, device=DEV)
    _check("crafted", rows, [1, 2, 3, 5, 9, 10, 15], variant)
    if variant == VARIANTS[0]:
        assert _topk(rows, 3, variant)[0][0].tolist() == [0, 1, 4]  # 1.0, then +0.0 and -0.0 by index
        assert _topk(rows, 3, variant)[0][1].tolist() == [0, 2, 5]  # three NaNs
        assert _topk(rows, 2, variant)[0][6].tolist() == [0, 3]  # -NaN and NaN


@pytest.mark.parametrize("cols,variant", [(c, "bisectw1") for c in (1, 5, 15, 16, 17, 70, 624, 1800)]
                         + [(c, "radixw1x") for c in (17, 624, 1800)])
def test_random_rows_of_several_widths(cols, variant):
    """Gaussian rows (the value-space bisection's case), widths that are not powers of two;
    k = 1, 3, ~KVb/8, KVb - 1, KVb."""
    g = torch.Generator().manual_seed(cols)
    n = 2 if cols >= 624 else 3
    rows = (torch.randn(n, cols, generator=g) * 3 + 0.5).to(DEV)
    topks = [1, 3, max(1, cols // 8), max(1, cols - 1), cols] if cols < 624 else [1, cols // 8, cols - 1]
    _check(f"randn{cols}", rows, topks, variant)


@pytest.mark.parametrize("cols,variant", [(37, "bisectw1"), (624, "bisectw1"), (1181, "bisectw1"), (624, "radixw1")])
def test_heavy_ties(cols, variant):
    """Scores from 9 values: the K-th largest is tied with ~KVb/9 others (the bisection ends in
    key-space steps); a row of one value and one of two values."""
    g = torch.Generator().manual_seed(100 + cols)
    rows = torch.randint(-4, 5, (3, cols), generator=g).float() / 4
    rows[1] = 0.5
    rows[2] = torch.where(torch.rand(cols, generator=g) < 0.3, 1.0, -1.0)
    _check(f"ties{cols}", rows.to(DEV), [1, cols // 8, cols - 1], variant)


def test_special_values_in_wide_rows():
    """A 640-lane row (two chunks) with NaNs, +-inf and signed zeros spread over both chunks,
    k across the special values; a Gaussian row whose extremes are +-inf (no value midpoint)."""
    g = torch.Generator().manual_seed(7)
    rows = torch.randn(3, 600, generator=g)
    rows[0, [3, 550, 599]] = NAN
    rows[0, [10, 520]] = INF
    rows[0, [0, 511, 512]] = -INF
    rows[1, ::7] = 0.0
    rows[1, 3::7] = -0.0
    rows[2, [5, 580]] = INF
    rows[2, [6, 590]] = -INF
    for variant in ("bisectw1", "radixw1x"):
        _check("special600", rows.to(DEV), [1, 3, 75, 599], variant)


@pytest.mark.parametrize("variant", ["bisectw2", "radixw2"])
def test_many_rows_and_leading_dims(variant):
    """[2, 3, 5, 40] scores: 30 rows, one program each; the counts are written for every row."""
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(2, 3, 5, 40, generator=g)
    scores[0, 1, 3] = 2.0  # one all-tied row among them
    _check("rows30", scores.to(DEV), [5], variant)


def test_select_fwd_with_the_new_variants():
    """vsa_select_fwd(topk_variant=...) runs them on its own scores scratch: the same lists."""
    g = torch.Generator().manual_seed(3)
    qc, kc, vc = (torch.randn(1, 2, n, 32, generator=g).to(DEV) for n in (5, 40, 40))
    sizes = torch.tensor([16, 0, 5, 16] * 10, dtype=torch.int32, device=DEV)
    outs = {}
    for variant in ("search32", "bisectw1", "radixw1x"):
        out, lse = torch.empty_like(qc), torch.empty(1, 2, 5, device=DEV)
        idx = torch.empty(1, 2, 5, 7, dtype=torch.int32, device=DEV)
        num = torch.empty(1, 2, 5, dtype=torch.int32, device=DEV)
        scores = torch.empty(1, 2, 5, 40, device=DEV)
        vsa_select_fwd(qc, kc, vc, sizes, out, None, lse, idx, num, scores, topk=7, sm_scale=32 ** -0.5,
                       topk_variant=variant)
        outs[variant] = (idx, num, scores)
    for variant in ("bisectw1", "radixw1x"):
        assert torch.equal(outs[variant][0], outs["search32"][0]) and torch.equal(outs[variant][1], outs["search32"][1])
    assert torch.equal(outs["search32"][0].long(), topk_indices_reference(outs["search32"][2], 7))


def test_variant_names_and_chunks():
    assert parse_topk_variant("bisectw1") == ("bisect", 1, False)
    assert parse_topk_variant("radixw4x") == ("radix", 4, True) and parse_topk_variant("radixw8") == ("radix", 8, False)
    assert parse_radix_variant("rows1w1x") is None and parse_radix_variant("search32") is None
    for bad in ("bisectw3", "bisectw1x", "radixw16", "radix1w1", "bisect", "radixw", "bisectw2c64"):
        with pytest.raises(ValueError, match="topk variant"):
            parse_topk_variant(bad)
    assert radix_chunks(1800) == (2048, 0) and radix_chunks(624) == (512, 128) and radix_chunks(1180) == (1024, 256)
    assert radix_chunks(512) == (512, 0) and radix_chunks(5) == (32, 0) and radix_chunks(17) == (32, 0)
    assert radix_chunks(70) == (64, 16) and radix_chunks(600) == (512, 128)
    for kvb in (1, 5, 16, 17, 40, 100, 624, 1181, 1800, 16384):
        main, tail = radix_chunks(kvb)
        assert main + tail >= kvb and main >= 16 and not main & (main - 1)
        assert tail == 0 or (tail >= 16 and not tail & (tail - 1))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("variant", ["bisectw1", "bisectw2", "bisectw4", "radixw1x", "radixw4x"])
@pytest.mark.parametrize("shape,topk", [((24, 1800, 1800), 225), ((12, 624, 624), 78), ((40, 300, 1180), 148)],
                         ids=["hunyuan-720p", "wan1.3b-480p", "wan14b-720p-slice"])
def test_gpu_model_sized_rows_equal_search32(shape, topk, variant):
    """Model-sized rows on the GPU (HunyuanVideo 720p: 24 heads x 1800 x 1800, k = 225): the same
    lists as search32, on Gaussian scores and on a copy quantised to a few values (ties)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    scores = torch.randn(shape, device="cuda", generator=g)
    for s in (scores, torch.round(scores * 2) / 2):
        want_idx, want_num = _topk(s, topk, "search32")
        got_idx, got_num = _topk(s, topk, variant)
        assert torch.equal(got_idx, want_idx) and torch.equal(got_num, want_num)
