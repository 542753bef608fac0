"""GPU tests of the experimental split Hopper 64-token backward (``adapters/cute_sm90_bwd64_split``: the
warp-specialized main kernel built with ``ds_out`` stores each pair's dS tile, ``BlockSparseDq64Sm90``
sums dq from them), on a compute-capability 9.0 GPU.

The cases and tolerances of the route's suite (``test_block_sparse_bwd64_sm90_gpu.py``, from the
tcgen05 chain's: fp32 autograd reference, per tensor rel_max 1e-2 and mean |err| 1e-3): ragged sizes
with NaN K / Inf V in the padding, B = 2, kv blocks nobody selects and q blocks that select nothing,
full tiles, heads in chunks of one sequence; dq the same bits run to run (one fixed summation order), dk/dv the route's bits (the same
kernel path)."""

import pytest
import torch

from fastvideo_cute.metadata import invert_indices

from test_block_sparse_bwd64_gpu import check_close, make_case, reference, _poison_allocator

S = pytest.importorskip("fastvideo_cute.adapters.cute_sm90_bwd64_split")
A = pytest.importorskip("fastvideo_cute.adapters.cute_sm90_bwd64")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="needs a compute capability 9.0 GPU"),
]
pytest.importorskip("cutlass")

from fastvideo_cute.backends.sm90_backend import _BWD_WS_CONFIG as ROUTE  # noqa: E402
CASES = [dict(), dict(batch=2, heads=3, seed=1), dict(nb=12, topk=5, excluded=(3, 7), empty_q=(0, 5), seed=2),
         dict(nb=16, topk=6, ragged=False, nan_padding=False, seed=3), dict(nb=10, topk=10, seed=4)]


@pytest.mark.parametrize("case", CASES + [dict(batch=2, heads=3, seed=5, cap=1)],
                         ids=[str(i) for i in range(len(CASES))] + ["chunks"])
def test_split_matches_the_fp32_reference(case):
    case = dict(case)
    cap = case.pop("cap", S.WORKSPACE_CAP)  # 1: one (batch, head) sequence a chunk
    q, k, v, do, idx, num, vbs, pad = make_case(**case)
    o, lse, rdq, rdk, rdv = reference(q, k, v, do, idx, num, vbs)
    kidx, knum = invert_indices(idx, num, vbs.numel())
    for t in (q, q, q):
        _poison_allocator(t)
    dq, dk, dv = S.sm90_block_sparse_bwd64_split(q, k, v, o, do, lse, idx, num, kidx, knum, vbs, workspace_cap=cap)
    torch.cuda.synchronize()
    for name, got, ref in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        err = (got.float() - ref).abs()
        print(f"\n[{name}] rel_max {err.max().item() / ref.abs().max().item():.2e} mean {err.mean().item():.2e}")
        check_close(name, got, ref)
    assert (dk[..., pad, :] == 0).all() and (dv[..., pad, :] == 0).all(), "padded key rows"
    dq2, dk2, dv2 = S.sm90_block_sparse_bwd64_split(q, k, v, o, do, lse, idx, num, kidx, knum, vbs,
                                                    workspace_cap=cap)
    assert torch.equal(dq, dq2), "dq run to run"
    rq, rk, rv = A.sm90_block_sparse_bwd64(q, k, v, o, do, lse, kidx, knum, vbs, main="ws",
                                           ws_config={**ROUTE, "group_blocks": 0})
    assert torch.equal(dk, rk) and torch.equal(dv, rv), "dk/dv: the route's kernel path"


@pytest.mark.parametrize("case, q_groups, cap", [
    (dict(nb=16, topk=6, batch=2, heads=3, excluded=(3,), empty_q=(0, 9), seed=11), 4, S.WORKSPACE_CAP),
    (dict(nb=16, topk=6, batch=2, heads=3, seed=12), 5, 1),  # uneven groups, one sequence a chunk
    (dict(nb=12, topk=12, seed=13), 6, S.WORKSPACE_CAP),  # every kv block in both groups
], ids=["groups4", "groups5_chunks", "dense_groups6"])
def test_q_groups_match_the_fp32_reference(case, q_groups, cap):
    """``q_groups``: each kv block's k2q list split over q groups (one CTA each; the last to finish writes
    dk/dv from the ticket workspace), the dS slots and counters laid out after the ticket's part. Against
    the fp32 reference (ragged NaN/Inf padding, kv blocks nobody selects, empty q rows); dq the one-group
    chain's bits (dS per pair does not depend on the grouping), dk/dv within rounding of it."""
    q, k, v, do, idx, num, vbs, pad = make_case(**case)
    o, lse, rdq, rdk, rdv = reference(q, k, v, do, idx, num, vbs)
    kidx, knum = invert_indices(idx, num, vbs.numel())
    dq, dk, dv = S.sm90_block_sparse_bwd64_split(q, k, v, o, do, lse, idx, num, kidx, knum, vbs, workspace_cap=cap,
                                                 q_groups=q_groups)
    one = S.sm90_block_sparse_bwd64_split(q, k, v, o, do, lse, idx, num, kidx, knum, vbs, workspace_cap=cap)
    torch.cuda.synchronize()
    for name, got, ref in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        check_close(name, got, ref)
    assert (dk[..., pad, :] == 0).all() and (dv[..., pad, :] == 0).all(), "padded key rows"
    assert torch.equal(dq, one[0]), "dq: the one-group chain's bits"
    # the same fp32 parts summed in another order, then rounded to bf16 once: at most one bf16 ulp apart
    # (2^-8 of the element, so of the tensor's max), checked at 2^-7 for headroom
    for name, got, want in (("dk", dk, one[1]), ("dv", dv, one[2])):
        err = (got.float() - want.float()).abs().max().item() / want.float().abs().max().item()
        assert err <= 2 ** -7, (name, err)


NO_HINTS = dict(ds_evict_first=False)


@pytest.mark.parametrize("cfg, main", [(dict(S.DQ_CONFIG, stages=3, ctas_per_sm=3), None),
                                       (dict(S.DQ_CONFIG, stages=2, ctas_per_sm=3), None),
                                       (dict(S.DQ_CONFIG, **NO_HINTS), NO_HINTS),
                                       (dict(S.DQ_CONFIG, k_evict_last=True), None)],
                         ids=["s3c3", "s2c3", "l2hints-off", "l2hints-k"])
def test_other_dq_builds_give_the_same_bits(cfg, main):
    """The dQ kernel's ring depth and CTAs per SM change when bytes arrive, never the sum's order, and the L2
    cache hints (the default's dS stored and loaded evict_first, here switched off: ``l2hints-off``; K loaded
    evict_last as well: ``l2hints-k``) change nothing but the cache's choices: dq/dk/dv equal the default
    build's bit for bit (ragged NaN/Inf padding, an empty q row)."""
    q, k, v, do, idx, num, vbs, pad = make_case(nb=12, topk=5, batch=2, heads=3, excluded=(3,), empty_q=(0, 5), seed=7)
    o, lse, rdq, rdk, rdv = reference(q, k, v, do, idx, num, vbs)
    kidx, knum = invert_indices(idx, num, vbs.numel())
    want = S.sm90_block_sparse_bwd64_split(q, k, v, o, do, lse, idx, num, kidx, knum, vbs)
    got = S.sm90_block_sparse_bwd64_split(q, k, v, o, do, lse, idx, num, kidx, knum, vbs, dq_config=cfg,
                                          main_config=main)
    torch.cuda.synchronize()
    check_close("dq", got[0], rdq)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.equal(g, w), name


def test_triton_slots_equal_the_torch_slots_on_the_gpu():
    q, k, v, do, idx, num, vbs, pad = make_case(nb=24, topk=5, batch=2, heads=3, empty_q=(4,), excluded=(7,), seed=9)
    kidx, knum = invert_indices(idx, num, vbs.numel())
    nb, s = vbs.numel(), 6
    qoff, got = S.chunk_slots(idx.reshape(s, nb, -1).to(torch.int32), num.reshape(s, nb).to(torch.int32),
                              kidx.reshape(s, nb, -1).to(torch.int32), knum.reshape(s, nb).to(torch.int32), nb)
    qoff_t, want = S.pair_slots(idx, num, kidx, nb)
    valid = torch.arange(got.shape[1], device=got.device)[None, :] < knum.reshape(-1, 1)
    assert torch.equal(qoff, qoff_t) and torch.equal(got[valid], want[valid])


@pytest.mark.parametrize("what", ["kv_len", "bshd"])
def test_calls_it_cannot_serve_raise_before_any_launch(what):
    """q_len != kv_len (the split, like the route, is self-attention only) and a BSHD tensor (the adapter
    takes BHSD; the backend transposes): a ValueError naming the tensor, nothing launched."""
    q, k, v, do, idx, num, vbs, pad = make_case(nb=8, topk=3, seed=6)
    kidx, knum = invert_indices(idx, num, vbs.numel())
    lse = torch.zeros(q.shape[:3], device=q.device)
    if what == "kv_len":
        k = torch.cat([k, k[:, :, :64]], dim=2)
        match = "k has shape"
    else:
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # BSHD memory seen as BHSD
        match = "q must be contiguous"
    with pytest.raises(ValueError, match=match):
        S.sm90_block_sparse_bwd64_split(q, k, v, q, do, lse, idx, num, kidx, knum, vbs)
