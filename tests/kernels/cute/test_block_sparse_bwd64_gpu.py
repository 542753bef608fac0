"""GPU tests of the CuTe DSL VSA backward, 64-token blocks (fastvideo_cute.adapters.cute_sm100_bwd).

Two tiers:
  - the arch-independent stages (preprocess, work order, postprocess) on any GPU they are built
    for (sm_90: the H200 is the verification target; sm_100, sm_103), against torch; and the chain
    preprocess -> torch model of the main kernel (``emulate_main``) -> postprocess against the fp32
    autograd reference and the Triton backward;
  - the whole backward (tcgen05 main kernel) on a compute-capability 10.x GPU only, seed 000's
    cases and tolerances: ragged sizes, topk not a multiple of 4, zero-count kv blocks with exactly
    zero dk/dv, padded key rows exactly 0, 65,536 tokens with two runs within summation-order noise.
    The main kernel compiles but has not run on a GPU yet: these are its first runtime tests.

So that a missed store cannot hide behind a recycled zero buffer, outputs the kernels must write
are pre-filled with NaN (or NaN blocks are left in the caching allocator).

Run (H200: common stages; B200/GB200: also the whole backward, the tests pass the opt-in themselves):
    python -m pytest -q -m gpu tests/kernels/cute/test_block_sparse_bwd64_gpu.py
(a first tcgen05 run is best wrapped in ``timeout -s KILL 600``: a wrong barrier phase would hang.)
"""

import math

import pytest
import torch

from fastvideo_cute.adapters import cute_sm100_bwd as A
from fastvideo_cute.metadata import index_to_map, invert_indices
from fastvideo_cute.reference import block_sparse_attn_reference

BLOCK = 64
HEAD_DIM = 128
SCALE = HEAD_DIM**-0.5
# Seed 000 (measured on GB200, ~2x / 3.5x headroom): per tensor against the fp32 reference.
REL_MAX_TOL = 1e-2
MEAN_ABS_TOL = 1e-3


def _cap():
    return torch.cuda.get_device_capability() if torch.cuda.is_available() else None


def _common_runnable() -> bool:
    return _cap() in A.COMMON_CAPABILITIES and A.cute_dsl_importable()


def _main_runnable() -> bool:
    # seed 000: the whole chain runs on sm_100a (10.0); a 10.3 device is refused by the predicate
    return _cap() in A.MAIN_CAPABILITIES and A.cute_dsl_importable() and A.main_kernel_available()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _common_runnable(), reason="needs an sm_90/sm_100/sm_103 GPU and the CuTe DSL"),
]
needs_main = pytest.mark.skipif(not _main_runnable(),
                                reason="needs a compute-capability 10.0 GPU (sm_100a) and the tcgen05 main kernel")


def _poison_allocator(like: torch.Tensor, dtype=None):
    """Leave a NaN block of ``like``'s size in the caching allocator."""
    t = torch.full(like.shape, float("nan"), dtype=dtype or like.dtype, device=like.device)
    del t


def make_case(nb=8, topk=4, heads=2, batch=1, seed=0, ragged=True, excluded=(), empty_q=(), nan_padding=True):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    S = nb * BLOCK
    q, k, v, do = (torch.randn(batch, heads, S, HEAD_DIM, generator=gen, device="cuda").bfloat16() for _ in range(4))
    pool = torch.tensor([j for j in range(nb) if j not in excluded], device="cuda")
    topk = min(topk, pool.numel())
    scores = torch.rand(batch, heads, nb, pool.numel(), generator=gen, device="cuda")
    idx = pool[scores.topk(topk, dim=-1).indices].sort(dim=-1).values.to(torch.int32).contiguous()
    num = torch.full((batch, heads, nb), topk, dtype=torch.int32, device="cuda")
    for i in empty_q:
        num[:, :, i] = 0
    if ragged:
        vbs = torch.randint(BLOCK // 2, BLOCK + 1, (nb,), generator=gen, device="cuda", dtype=torch.int32)
    else:
        vbs = torch.full((nb,), BLOCK, dtype=torch.int32, device="cuda")
    pad = torch.arange(S, device="cuda") % BLOCK >= vbs.repeat_interleave(BLOCK)
    if nan_padding:
        k[..., pad, :] = float("nan")
        v[..., pad, :] = float("inf")
    return q, k, v, do, idx, num, vbs, pad


def reference(q, k, v, do, idx, num, vbs):
    """fp32 autograd: (out bf16, natural-log lse, dq, dk, dv fp32)."""
    nb = vbs.numel()
    qf, kf, vf = (t.float().requires_grad_() for t in (q, k, v))
    out, lse = block_sparse_attn_reference(qf, kf, vf, index_to_map(idx, num, nb), vbs)
    (out * do.float()).sum().backward()
    return out.detach().bfloat16(), lse.detach().contiguous(), qf.grad, kf.grad, vf.grad


def check_close(name, got, ref, rel=REL_MAX_TOL, mean=MEAN_ABS_TOL):
    got, ref = got.float(), ref.float()
    assert torch.isfinite(got).all(), f"{name}: non-finite values"
    diff = (got - ref).abs()
    rel_max = diff.max().item() / max(ref.abs().max().item(), 1e-6)
    mean_abs = diff.mean().item()
    assert rel_max <= rel and mean_abs <= mean, f"{name}: rel_max={rel_max:.3e} mean_abs={mean_abs:.3e}"


# ---------------------------------------------------------------- arch-independent stages


def test_preprocess():
    torch.manual_seed(0)
    B, H, nb = 2, 3, 8
    S = nb * BLOCK
    o, do = (torch.randn(B, H, S, HEAD_DIM, device="cuda").bfloat16() for _ in range(2))
    lse = torch.randn(B, H, S, device="cuda") * 3
    lse[0, 1, 70:140] = -math.inf
    lse[1, 2, :5] = -math.inf
    num = torch.randint(0, 5, (B, H, nb), dtype=torch.int32, device="cuda")
    num[0, 0, 0] = 0
    num[1, 2, nb - 1] = 0
    vbs = torch.full((nb,), BLOCK, dtype=torch.int32, device="cuda")
    dk = torch.full_like(o, float("nan"))
    dv = torch.full_like(o, float("nan"))
    _poison_allocator(o, torch.float32)
    res = A.sm100_bwd64_common_stages(o, do, lse, num, vbs, dk=dk, dv=dv)
    torch.cuda.synchronize()
    ref_delta = (o.float() * do.float()).sum(-1)
    torch.testing.assert_close(res["delta"], ref_delta, rtol=1e-5, atol=1e-4)
    ref_lse2 = torch.where(lse == -math.inf, math.inf, lse * A.LOG2E)
    assert torch.equal(torch.isinf(res["lse2"]), lse == -math.inf)
    assert (res["lse2"][lse == -math.inf] > 0).all()
    torch.testing.assert_close(res["lse2"], ref_lse2, rtol=1e-6, atol=0)
    assert res["dq_accum"].shape == (B, H, S, HEAD_DIM) and (res["dq_accum"] == 0).all()
    zero_rows = (num == 0).repeat_interleave(BLOCK, dim=-1)  # [B, H, S]
    assert (dk[zero_rows] == 0).all() and (dv[zero_rows] == 0).all()
    assert torch.isnan(dk[~zero_rows]).all() and torch.isnan(dv[~zero_rows]).all()  # the main kernel's rows
    assert res["order"] is None


def test_postprocess():
    torch.manual_seed(1)
    B, H, S = 2, 2, 6 * BLOCK
    acc = torch.randn(B, H, S, HEAD_DIM, device="cuda") * 10
    lse = torch.randn(B, H, S, device="cuda")
    lse[1, 0, 100:200] = -math.inf
    acc[1, 0, 100:200] = float("nan")  # whatever dq_accum holds there, dq is 0
    dq = torch.full((B, H, S, HEAD_DIM), float("nan"), dtype=torch.bfloat16, device="cuda")
    got = A.sm100_bwd64_postprocess(acc, lse, SCALE, dq=dq)
    torch.cuda.synchronize()
    ref = torch.where((lse == -math.inf)[..., None], 0.0, acc * SCALE).bfloat16()
    assert got.data_ptr() == dq.data_ptr()
    assert torch.equal(got, ref)


def test_work_order_on_device():
    nb = A.ORDER_MIN_KV_BLOCKS
    num = torch.randint(0, 128, (1, 2, nb), dtype=torch.int32, device="cuda")
    order = A.work_order(num, nb)
    assert order.is_cuda and order.dtype == torch.int32
    assert torch.equal(order.sort().values, torch.arange(2 * nb, dtype=torch.int32, device="cuda"))
    assert A.work_order(num[..., :nb - 2], nb - 2) is None


@pytest.mark.parametrize(
    "nb,topk,excluded,empty_q,ragged",
    [(8, 4, (), (), False), (8, 3, (), (), True), (8, 5, (2, 5), (), True), (8, 7, (), (3,), True), (16, 3, (), (), True)],
)
def test_chain_with_emulated_main(nb, topk, excluded, empty_q, ragged):
    """preprocess (kernel) -> main (torch model) -> postprocess (kernel) vs fp32 autograd and the
    Triton backward: checks the stages' conventions (lse2, delta, zeroing, scaling) end to end."""
    from fastvideo_cute.kernels.triton.block_sparse_bwd import block_sparse_attn_bwd

    q, k, v, do, idx, num, vbs, pad = make_case(nb=nb, topk=topk, excluded=excluded, empty_q=empty_q, ragged=ragged)
    o, lse, rdq, rdk, rdv = reference(q, k, v, do, idx, num, vbs)
    kidx, knum = invert_indices(idx, num, nb)
    res = A.sm100_bwd64_common_stages(o, do, lse, knum, vbs)
    dq_accum, dk, dv = A.emulate_main(q, k, v, do, res["lse2"], res["delta"], kidx, knum, vbs, SCALE)
    res["dq_accum"] += dq_accum  # the main kernel's reduce-add
    dq = A.sm100_bwd64_postprocess(res["dq_accum"], lse, SCALE)
    selected = (knum > 0).repeat_interleave(BLOCK, dim=-1)[..., None]
    dk = torch.where(selected, dk.bfloat16(), res["dk"])
    dv = torch.where(selected, dv.bfloat16(), res["dv"])
    for name, got, ref in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        check_close(name, got, ref)
    assert (dk[..., pad, :] == 0).all() and (dv[..., pad, :] == 0).all()
    for j in excluded:
        assert (dk[..., j * BLOCK:(j + 1) * BLOCK, :] == 0).all()
        assert (dv[..., j * BLOCK:(j + 1) * BLOCK, :] == 0).all()
    if empty_q:
        assert (dq[lse == -math.inf] == 0).all()

    tdq, tdk, tdv = (torch.empty_like(q) for _ in range(3))
    block_sparse_attn_bwd(q, k, v, o, do, lse, idx, num, kidx, knum, vbs, tdq, tdk, tdv,
                          sm_scale=SCALE, q_block=BLOCK, kv_block=BLOCK)
    for name, got, ref in (("dq", dq, tdq), ("dk", dk, tdk), ("dv", dv, tdv)):
        check_close(f"{name} vs Triton", got, ref, rel=2e-2, mean=2e-3)


# ---------------------------------------------------------------- the whole backward (10.x)


def _run_full(q, k, v, o, do, lse, idx, num, vbs):
    kidx, knum = invert_indices(idx, num, vbs.numel())
    for t in (q, q, q):
        _poison_allocator(t)
    with pytest.warns(RuntimeWarning):
        return A.sm100_block_sparse_bwd64(q, k, v, o, do, lse, kidx, knum, vbs, allow_unverified=True)


def _full_vs_reference(**case):
    q, k, v, do, idx, num, vbs, pad = make_case(**case)
    o, lse, rdq, rdk, rdv = reference(q, k, v, do, idx, num, vbs)
    dq, dk, dv = _run_full(q, k, v, o, do, lse, idx, num, vbs)
    torch.cuda.synchronize()
    for name, got, ref in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        assert got.dtype == torch.bfloat16
        check_close(name, got, ref)
    assert (dk[..., pad, :] == 0).all() and (dv[..., pad, :] == 0).all(), "padded key rows"
    return (dq, dk, dv), lse


@needs_main
def test_full_matches_reference():
    _full_vs_reference(ragged=False)


@needs_main
def test_full_batch_two_ragged():
    _full_vs_reference(batch=2, ragged=True, seed=1)


@needs_main
@pytest.mark.parametrize("topk", [1, 2, 3, 5, 7])
def test_full_topk_not_a_multiple_of_four(topk):
    _full_vs_reference(topk=topk, ragged=True)


@needs_main
@pytest.mark.parametrize("nb", [2, 4, 16])
def test_full_sequence_lengths(nb):
    _full_vs_reference(nb=nb, topk=min(3, nb), ragged=True)


@needs_main
def test_full_zero_count_kv_blocks_and_empty_q_blocks():
    (dq, dk, dv), lse = _full_vs_reference(excluded=(2, 5), empty_q=(1,), ragged=True)
    for j in (2, 5):
        assert (dk[..., j * BLOCK:(j + 1) * BLOCK, :] == 0).all()
        assert (dv[..., j * BLOCK:(j + 1) * BLOCK, :] == 0).all()
    assert (dq[lse == -math.inf] == 0).all()


@needs_main
def test_full_65536_tokens_vs_triton_and_run_to_run():
    """1,024 kv blocks (the device work order's regime), 12.5% density: vs the Triton backward,
    and two runs within summation-order noise (seed 000: rel_max 2e-2, mean 1e-4)."""
    from fastvideo_cute.kernels.triton.block_sparse_bwd import block_sparse_attn_bwd

    nb, topk, heads = 1024, 128, 4
    q, k, v, do, idx, num, vbs, _ = make_case(nb=nb, topk=topk, heads=heads, ragged=False, nan_padding=False)
    kidx, knum = invert_indices(idx, num, nb)
    # o and lse from the Triton forward (a dense fp32 reference at 65,536 tokens would not fit).
    o, lse = _triton_forward(q, k, v, idx, num, vbs)
    tdq, tdk, tdv = (torch.empty_like(q) for _ in range(3))
    block_sparse_attn_bwd(q, k, v, o, do, lse, idx, num, kidx, knum, vbs, tdq, tdk, tdv,
                          sm_scale=SCALE, q_block=BLOCK, kv_block=BLOCK)
    got = _run_full(q, k, v, o, do, lse, idx, num, vbs)
    again = _run_full(q, k, v, o, do, lse, idx, num, vbs)
    for name, g, r in zip(("dq", "dk", "dv"), got, (tdq, tdk, tdv)):
        check_close(f"{name} vs Triton", g, r, rel=2e-2, mean=2e-3)
    for name, g1, g2 in zip(("dq", "dk", "dv"), got, again):
        check_close(f"{name} run to run", g2, g1, rel=2e-2, mean=1e-4)


def _triton_forward(q, k, v, idx, num, vbs):
    from fastvideo_cute.kernels.triton.block_sparse_fwd import block_sparse_attn_fwd

    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    block_sparse_attn_fwd(q, k, v, idx, num, vbs, o, lse, sm_scale=SCALE, q_block=BLOCK, kv_block=BLOCK)
    return o, lse
