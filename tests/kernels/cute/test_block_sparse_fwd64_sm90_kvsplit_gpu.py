"""The sm90 64-token forward split by kv range (``sm90_fwd64(kv_splits=)``: one launch per range,
later launches merging their output with the earlier ranges' by the LSEs, the kernel's
``merge_prev``) on an sm_90 GPU, against the fp32 reference and against the unsplit call.

Cases: BHSD and BSHD, B = 2, q_len != kv_len, ragged kv sizes with NaN in padded K and Inf in
padded V, an empty kv block selected by every row, a query tile with no entry (out 0, LSE -inf
after every merge), rows whose entries all fall in one range (the other launches merge an empty
side), a NaN in a visible query row (NaN out and LSE through the merge), with and without the fused
gate, and with ``out_s`` (the training forward: out_s is the merged sparse branch).

Tolerances: the earlier ranges' output passes through bf16 once before the merge and the result is
rounded again, so the bound is the plain kernel's ``OUT_TOL`` (1.6e-2 for bf16: two half-ulps at
|out| ~ 2; the plain kernel measured 1.3e-3 to 6.8e-3 with one rounding) and 1e-4 for the LSE
(the merge adds one fp32 log / exp per row).
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)
pytest.importorskip("cutlass")

from fastvideo_cute import reference  # noqa: E402
from fastvideo_cute.adapters.cute_sm90_fwd64 import sm90_fwd64  # noqa: E402
from fastvideo_cute.metadata import map_to_index  # noqa: E402

OUT_TOL, LSE_TOL = 1.6e-2, 1e-4


def _case(bshd, B=2, H=2, SQ=768, SK=1280, D=128, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shp = (lambda s: (B, s, H, D)) if bshd else (lambda s: (B, H, s, D))
    q = torch.randn(shp(SQ), device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(shp(SK), device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    qb, kb = SQ // 64, SK // 64
    bm = torch.rand(B, H, qb, kb, device="cuda", generator=g) < 0.4
    sizes = torch.full((kb,), 64, dtype=torch.int32, device="cuda")
    sizes[2], sizes[7], sizes[-1] = 0, 23, 41
    bm[..., 2] = True  # an empty block selected everywhere
    bm[0, 0, 1] = False  # a query tile with no entry
    bm[0, 1, 3] = False
    bm[0, 1, 3, :3] = True  # entries in the first range only (2 is the empty block)
    bm[1, 0, 4] = False
    bm[1, 0, 4, -3:] = True  # entries in the last range only
    pad = (torch.arange(SK, device="cuda") % 64) >= sizes.repeat_interleave(64)
    for x, val in ((k, float("nan")), (v, float("inf"))):
        if bshd:
            x[:, pad] = val
        else:
            x[:, :, pad] = val
    idx, num = map_to_index(bm)
    return q, k, v, bm, sizes, idx.to(torch.int32).contiguous(), num.to(torch.int32).contiguous()


def _bhsd(x, bshd):
    return x.transpose(1, 2) if bshd else x


@pytest.mark.parametrize("packed", [False, True], ids=["lists", "packed"])
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("mode", ["plain", "gate", "train"])
@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_split_forward_matches_reference_and_the_unsplit_call(bshd, mode, splits, packed):
    """(``packed``: the kernel's ``packed_steps``, each range's lists packed on their own.)"""
    q, k, v, bm, sizes, idx, num = _case(bshd, seed=splits)
    ro, rl = reference.block_sparse_attn_reference(*(_bhsd(t, bshd).float() for t in (q, k, v)), bm, sizes, 64)
    kw = {"variant": {"packed_steps": True}} if packed else {}
    if mode != "plain":
        g = torch.Generator(device="cuda").manual_seed(7)
        kw["gate"] = torch.rand(q.shape, device="cuda", dtype=q.dtype, generator=g)
        kw["out_c"] = torch.randn(2, 2, q.shape[1 if bshd else 2] // 64, 128, device="cuda", dtype=q.dtype, generator=g)
    if mode == "train":
        kw["out_s"] = torch.full_like(q, float("nan"))
    out, lse = sm90_fwd64(q, k, v, idx, num, sizes, bshd=bshd, kv_splits=splits, **kw)
    o_s = _bhsd(kw["out_s"] if mode == "train" else out, bshd).float()
    want = ro
    if mode != "plain":
        want = reference.gate_compose_reference(ro, kw["out_c"], _bhsd(kw["gate"], bshd), 64)
    got = _bhsd(out, bshd).float()
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() <= OUT_TOL, (got - want).abs().max()
    if mode == "train":
        assert (o_s - ro).abs().max() <= OUT_TOL
    finite = torch.isfinite(rl)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rl))
    assert (lse - rl)[finite].abs().max() <= LSE_TOL
    if mode == "plain":  # the query tile with no entry: 0 after every merge
        assert (got[0, 0, 64:128] == 0).all()
    one = sm90_fwd64(q, k, v, idx, num, sizes, bshd=bshd, kv_splits=1, **{**kw, **(
        {"out_s": torch.empty_like(q)} if mode == "train" else {})})
    assert (one[0].float() - out.float()).abs().max() <= OUT_TOL
    assert (one[1] - lse)[finite].abs().max() <= LSE_TOL


def test_nan_query_row_propagates_through_the_merge():
    q, k, v, bm, sizes, idx, num = _case(False, seed=5)
    q[0, 0, 200, 3] = float("nan")  # q tile 3 of head 0: entries in both ranges
    assert num[0, 0, 3] > 0
    out, lse = sm90_fwd64(q, k, v, idx, num, sizes, bshd=False, kv_splits=2)
    assert torch.isnan(out[0, 0, 200]).all() and torch.isnan(lse[0, 0, 200])
    assert torch.isfinite(out[0, 0, 201]).all() and torch.isfinite(lse[0, 0, 201])


@pytest.mark.parametrize("splits", [2, 3, 4])
def test_triton_lists_match_the_torch_ops(splits, monkeypatch):
    """``_TRITON_LISTS`` (kernels/triton/kv_range_lists, on by default since this passed on the H200): the same
    counts and the same entries up to each count as the torch ops, and the split forward with them
    bitwise the one with the torch lists."""
    from fastvideo_cute.adapters import cute_sm90_fwd64 as A

    q, k, v, bm, sizes, idx, num = _case(False, seed=9)
    kvb = k.shape[2] // 64
    want = A._split_lists_torch(idx, num, kvb, splits)
    got = A._split_lists_triton(idx, num, kvb, splits)
    for (gi, gn), (wi, wn) in zip(got, want):
        assert torch.equal(gn, wn)
        slots = torch.arange(idx.shape[-1], device="cuda")
        keep = slots < wn[..., None]
        assert torch.equal(torch.where(keep, gi, 0), torch.where(keep, wi, 0))
    monkeypatch.setattr(A, "_TRITON_LISTS", False)
    ref = sm90_fwd64(q, k, v, idx, num, sizes, bshd=False, kv_splits=splits)
    monkeypatch.setattr(A, "_TRITON_LISTS", True)
    out = sm90_fwd64(q, k, v, idx, num, sizes, bshd=False, kv_splits=splits)
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
