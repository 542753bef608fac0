"""The CuTe route through the public API on a GPU (FASTVIDEO_VSA_CUTEDSL=1): 128/256 blocks,
BHSD and BSHD, gated VSA, inference == training forward, forced-backend errors. Skipped
without CUDA or without flash_attn.cute. Tolerances as tests/test_gpu_triton.py (bf16)."""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute.reference import block_sparse_attn_reference, video_sparse_attn_reference
from fastvideo_cute import ops
from fastvideo_cute.routes import RouteError

pytestmark = pytest.mark.gpu
OUT_TOL, GRAD_TOL = 1e-2, 2e-2


@pytest.fixture(autouse=True)
def _cute(monkeypatch):
    pytest.importorskip("flash_attn.cute")
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    monkeypatch.delenv("FASTVIDEO_VSA_TRITON", raising=False)
    monkeypatch.delenv("FASTVIDEO_VSA_BACKEND", raising=False)


def _nerr(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()


class _Observed:
    """Which backends ran inside the block, from the ops' dispatch counter (observed, not recomputed)."""

    def __enter__(self):
        self.before = ops.dispatch_counts.copy()
        return self

    def __exit__(self, *exc):
        self.ran = {key: n - self.before[key] for key, n in ops.dispatch_counts.items() if n != self.before[key]}


@pytest.mark.parametrize("block", [128, 256])
@pytest.mark.parametrize("bshd", [False, True])
def test_cute_route_block_sparse_fwd_bwd(block, bshd):
    torch.manual_seed(block + bshd)
    b, h, d = 1, 2, 128
    qb, kvb = 3, 4
    mk = (lambda n: torch.randn(b, n * block, h, d)) if bshd else (lambda n: torch.randn(b, h, n * block, d))
    q, k, v = (t.cuda().bfloat16().requires_grad_(True) for t in (mk(qb), mk(kvb), mk(kvb)))
    sizes = torch.tensor([block, block // 2 + 5, 0, 37], dtype=torch.int32, device="cuda")
    block_map = torch.rand(b, h, qb, kvb, device="cuda") < 0.6
    block_map[0, 1, 2] = False
    fn = {(128, False): fvc.block_sparse_attn_128, (128, True): fvc.block_sparse_attn_128_bshd,
          (256, False): fvc.block_sparse_attn_256, (256, True): fvc.block_sparse_attn_256_bshd}[(block, bshd)]
    with _Observed() as seen:
        out, lse = fn(q, k, v, block_map, sizes)
        dout = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    # FASTVIDEO_VSA_CUTEDSL=1 follows the measured route table: on these ragged sizes the forward is
    # sm90's (table v5: the 64-token tiles that cover the blocks) or FA4's; the backward is FA4's
    # or cuDNN's (CuTe-DSL kernels too) per the table's class for this call
    from fastvideo_cute.call import call_info
    from fastvideo_cute.routes import select_routes

    fwd_b, bwd_b = (b.name for b in select_routes(call_info(q, k, block, True, bshd, True, sizes)))
    assert fwd_b in ("sm90", "fa4") and bwd_b in ("fa4", "cudnn"), (fwd_b, bwd_b)
    assert seen.ran == {(fwd_b, "fwd"): 1, (bwd_b, "bwd"): 1}, seen.ran
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    ref, ref_lse = block_sparse_attn_reference(tb(q), tb(k), tb(v), block_map, sizes, block)
    refg = torch.autograd.grad(ref, (q, k, v), tb(dout).float())
    errs = [_nerr(tb(out), ref)] + [_nerr(g, r) for g, r in zip(grads, refg)]
    fin = torch.isfinite(ref_lse)
    print(f"\n[cute block={block} bshd={bshd}] out={errs[0]:.2e} dq={errs[1]:.2e} dk={errs[2]:.2e} dv={errs[3]:.2e}"
          f" lse={(lse[fin] - ref_lse[fin]).abs().max().item():.2e}")
    assert errs[0] < OUT_TOL and max(errs[1:]) < GRAD_TOL
    assert torch.equal(torch.isneginf(lse), ~fin)
    assert (tb(out)[0, 1, 2 * block:] == 0).all()
    with torch.no_grad():
        out_inf, _ = fn(q, k, v, block_map, sizes)
    assert torch.equal(out_inf, out.detach()), "inference forward must equal the training forward bit for bit"


@pytest.mark.parametrize("tile,bshd", [((2, 8, 8), False), ((4, 8, 8), True)])
def test_cute_route_gated_vsa(tile, bshd):
    torch.manual_seed(3)
    be = tile[0] * tile[1] * tile[2]
    nb, h, d, topk = 4, 2, 128, 2
    shape = (1, nb * be, h, d) if bshd else (1, h, nb * be, d)
    sizes = torch.tensor([be, be - 29, be, 61], dtype=torch.int32, device="cuda")
    q_sizes = torch.tensor([be, be, be - 7, be], dtype=torch.int32, device="cuda")
    xs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    for x, s in zip(xs[:3], (q_sizes, sizes, sizes)):
        xb = tb(x)
        for j, n in enumerate(s.tolist()):
            xb[:, :, j * be + n:(j + 1) * be] = 0
    gate = xs[3] * 0.1
    q, k, v, gate = (t.requires_grad_(True) for t in (xs[0], xs[1], xs[2], gate))
    fn = fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn
    out = fn(q, k, v, sizes, q_sizes, topk, block_size=tile, compress_attn_weight=gate)
    ref = video_sparse_attn_reference(tb(q), tb(k), tb(v), sizes, q_sizes, topk, tile, tb(gate))
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, gate), dout)
    refg = torch.autograd.grad(ref, (q, k, v, gate), tb(dout).float())
    errs = [_nerr(tb(out), ref)] + [_nerr(g, r) for g, r in zip(grads, refg)]
    print(f"\n[cute vsa tile={tile} bshd={bshd}] " + " ".join(f"{e:.2e}" for e in errs))
    assert errs[0] < OUT_TOL and max(errs[1:]) < GRAD_TOL


def test_forced_fa4_cannot_serve_64_token_backward(monkeypatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm_90 FA4 limits")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "fa4")
    q, k, v = (torch.randn(1, 1, 128, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    m = torch.ones(1, 1, 2, 2, dtype=torch.bool, device="cuda")
    s = torch.full((2,), 64, dtype=torch.int32, device="cuda")
    with pytest.raises(RouteError, match="128-wide kv tiles"):
        fvc.block_sparse_attn(q, k, v, m, s)
    with torch.no_grad():  # the 64-token forward alone is served by FA4 on sm_90
        out, _ = fvc.block_sparse_attn(q, k, v, m, s)
    ref, _ = block_sparse_attn_reference(q, k, v, m, s, 64)
    assert _nerr(out, ref) < OUT_TOL


def test_sm120_kernel_serves_vsa_inference_when_named(monkeypatch):
    """The mma.sync + TMA forward, reachable by name on sm_90 (default CuTe route on sm_120/121):
    it serves video_sparse_attn's no-grad sparse branch when every block is full, and refuses
    (with the reason) calls that need an LSE or a backward."""
    if tuple(torch.cuda.get_device_capability()) not in ((9, 0), (12, 0), (12, 1)):
        pytest.skip("sm_90/sm_120/sm_121 only")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm120")
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL", raising=False)
    torch.manual_seed(11)
    h, nb, be, topk = 2, 5, 128, 2
    q, k, v = (torch.randn(1, h, nb * be, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sizes = torch.full((nb,), be, dtype=torch.int32, device="cuda")
    with torch.no_grad(), _Observed() as seen:
        out = fvc.video_sparse_attn(q, k, v, sizes, sizes, topk, block_size=(2, 8, 8))
    assert seen.ran == {("sm120", "fwd"): 1}, seen.ran
    ref = video_sparse_attn_reference(q, k, v, sizes, sizes, topk, (2, 8, 8))
    err = _nerr(out, ref)
    print(f"\n[sm120 vsa inference] out nerr={err:.2e}")
    assert err < OUT_TOL
    # BSHD: the backend transposes to the kernel's BHSD and back.
    with torch.no_grad():
        out_bshd = fvc.video_sparse_attn_bshd(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), sizes, sizes,
                                              topk, block_size=(2, 8, 8))
    err_bshd = _nerr(out_bshd.transpose(1, 2), ref)
    print(f"[sm120 vsa inference, bshd] out nerr={err_bshd:.2e}")
    assert err_bshd < OUT_TOL
    m = torch.ones(1, h, nb, nb, dtype=torch.bool, device="cuda")
    with pytest.raises(RouteError, match="returns no LSE"), torch.no_grad():
        fvc.block_sparse_attn_128(q, k, v, m, sizes)
    with pytest.raises(RouteError, match="inference only"):
        fvc.video_sparse_attn(q.requires_grad_(True), k, v, sizes, sizes, topk, block_size=(2, 8, 8))


def test_sm100_tcgen05_64_token_fwd_bwd_when_named(monkeypatch):
    """Our tcgen05 64-token kernels through the API (by name: they are unverified on hardware
    until this passes on a compute-capability 10.0 GPU)."""
    if tuple(torch.cuda.get_device_capability()) != (10, 0):
        pytest.skip("sm_100 only")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm100")
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL", raising=False)
    torch.manual_seed(17)
    h, nb = 2, 8
    q, k, v = (torch.randn(1, h, nb * 64, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    sizes = torch.tensor([64, 64, 17, 64, 0, 64, 64, 33], dtype=torch.int32, device="cuda")
    block_map = torch.rand(1, h, nb, nb, device="cuda") < 0.4
    block_map[0, 0, 3] = False
    out, lse = fvc.block_sparse_attn(q, k, v, block_map, sizes)
    ref, ref_lse = block_sparse_attn_reference(q, k, v, block_map, sizes, 64)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    refg = torch.autograd.grad(ref, (q, k, v), dout.float())
    errs = [_nerr(out, ref)] + [_nerr(g, r) for g, r in zip(grads, refg)]
    print(f"\n[sm100 64] out={errs[0]:.2e} dq={errs[1]:.2e} dk={errs[2]:.2e} dv={errs[3]:.2e}")
    assert errs[0] < OUT_TOL and max(errs[1:]) < GRAD_TOL
    assert torch.equal(torch.isneginf(lse), ~torch.isfinite(ref_lse))
