"""Fused selection kernels (``kernels/triton/vsa_select.py``, ``vsa_coarse_bwd.py``) against the
fp32 references (``coarse_attention_reference``, ``topk_indices_reference``) and against the
library's own selection (``topk_block_map`` + ``map_to_index``), the latter exactly.

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py). Shapes are small: Qb below
one 32-row tile (masked rows), KVb above one 32-column chunk (two chunks), B = H = 2.

Tolerances: ``out_c``/``lse``/scores are fp32 dots in another summation order than torch's
matmul: measured max abs error 3e-7 / 5e-7 / 6e-7 on these shapes, so 1e-5 is headroom. The
backward's gradients: measured 4e-7 to 7e-7 (fp32 dout); 1e-5. With an fp16 ``out_c`` the cast is one fp16 rounding
(rel 2^-11 = 4.9e-4): rtol 1e-3. The top-k is compared exactly (``torch.equal``) whenever both
sides see the same scores: the kernel's own scores scratch, or integer-valued inputs whose scores
every summation order gives exactly.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.api import topk_block_map  # noqa: E402
from fastvideo_cute.kernels.triton.vsa_coarse_bwd import vsa_coarse_bwd  # noqa: E402
from fastvideo_cute.kernels.triton.vsa_select import vsa_select_fwd, vsa_topk  # noqa: E402
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


def _bwd(qc, kc, vc, sizes, out32, lse, dout):
    d = [torch.full_like(x, float("nan")) for x in (qc, kc, vc)]  # every element must be written
    vsa_coarse_bwd(qc, kc, vc, sizes, dout, out32, lse, *d, sm_scale=qc.shape[-1] ** -0.5)
    return d


@pytest.mark.parametrize("dout_dtype", [torch.float32, torch.float16])
def test_coarse_backward_matches_autograd_of_reference(dout_dtype):
    qc, kc, vc = _means(2, 2, 5, 40, 32, seed=9)
    sizes = _sizes(*KV_SIZES)
    _, out32, lse, _, _, _ = _run(qc, kc, vc, sizes, topk=3, with_out32=True)
    g = torch.Generator().manual_seed(10)
    dout = torch.randn(qc.shape, generator=g).to(DEV, dout_dtype)
    got = _bwd(qc, kc, vc, sizes, out32, lse, dout)
    leaves = [x.clone().requires_grad_(True) for x in (qc, kc, vc)]
    ref_out = coarse_attention_reference(*leaves, sizes)[0]
    want = torch.autograd.grad(ref_out, leaves, dout.float())
    for name, a, w in zip(("dqc", "dkc", "dvc"), got, want):
        torch.testing.assert_close(a, w, **TOL, msg=name)
    empty = sizes == 0
    assert (got[1][:, :, empty] == 0).all() and (got[2][:, :, empty] == 0).all()
    again = _bwd(qc, kc, vc, sizes, out32, lse, dout)
    assert all(torch.equal(a, b) for a, b in zip(got, again))  # deterministic


def test_coarse_backward_all_empty_is_zero():
    qc, kc, vc = _means(1, 1, 3, 4, 32, seed=12)
    sizes = _sizes(0, 0, 0, 0)
    _, out32, lse, _, _, _ = _run(qc, kc, vc, sizes, topk=1, with_out32=True)
    got = _bwd(qc, kc, vc, sizes, out32, lse, torch.randn(qc.shape, device=DEV))
    assert all((x == 0).all() for x in got)


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
