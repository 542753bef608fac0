"""Triton route on a real GPU, bf16 (skipped without CUDA). Run on the H200; the log is
committed under tests/logs/.

Error metric: max |got - ref| / max |ref| (normalised max error) against the fp32 reference.
bf16 has a unit roundoff of 2^-8 = 3.9e-3; the output is rounded once and P is rounded to
bf16 before the PV product, so the forward error is a few 1e-3 and the gradients (sums of
many rounded products) somewhat more. Bounds: 1e-2 forward, 2e-2 backward (measured values
are printed with -s and recorded in the log).
"""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute.reference import block_sparse_attn_reference

pytestmark = pytest.mark.gpu

OUT_TOL, GRAD_TOL = 1e-2, 2e-2
API = {64: (fvc.block_sparse_attn, fvc.block_sparse_attn_bshd),
       128: (fvc.block_sparse_attn_128, fvc.block_sparse_attn_128_bshd),
       256: (fvc.block_sparse_attn_256, fvc.block_sparse_attn_256_bshd)}


@pytest.fixture(autouse=True)
def _triton(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL", raising=False)


def _nerr(got, ref):
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-6)).item()


def _random_sizes(n, block, gen):
    sizes = torch.randint(1, block + 1, (n,), generator=gen, dtype=torch.int32)
    sizes[torch.rand(n, generator=gen) < 0.5] = block
    sizes[n // 2] = 0
    return sizes.cuda()


@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("bshd", [False, True])
def test_bf16_fwd_bwd_vs_reference(block, bshd):
    gen = torch.Generator().manual_seed(block + bshd)
    b, h, d = 2, 3, 128
    qb, kvb = 1024 // block, 1536 // block
    sq, skv = qb * block, kvb * block
    mk = (lambda s: torch.randn(b, s, h, d, generator=gen)) if bshd else (lambda s: torch.randn(b, h, s, d,
                                                                                                  generator=gen))
    q, k, v = mk(sq).cuda().bfloat16(), mk(skv).cuda().bfloat16(), mk(skv).cuda().bfloat16()
    sizes = _random_sizes(kvb, block, gen)
    block_map = (torch.rand(b, h, qb, kvb, generator=gen) < 0.4).cuda()
    block_map[0, 0, 0] = False  # a row block with nothing selected
    for t in (q, k, v):
        t.requires_grad_(True)
    out, lse = API[block][bshd](q, k, v, block_map, sizes)
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    ref, ref_lse = block_sparse_attn_reference(tb(q), tb(k), tb(v), block_map, sizes, block)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref_grads = torch.autograd.grad(ref, (q, k, v), tb(dout).float())
    errs = {"out": _nerr(tb(out), ref)}
    finite = torch.isfinite(ref_lse)
    errs["lse"] = (lse[finite] - ref_lse[finite]).abs().max().item()
    for n, g, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        errs[n] = _nerr(g, r)
    print(f"\n[triton bf16 block={block} bshd={bshd}] " + " ".join(f"{k}={v:.2e}" for k, v in errs.items()))
    assert errs["out"] < OUT_TOL and errs["lse"] < 1e-2
    assert all(errs[n] < GRAD_TOL for n in ("dq", "dk", "dv"))
    assert torch.equal(torch.isneginf(lse), ~finite)
    assert (tb(out)[0, 0, :block] == 0).all()


def test_65536_tokens_deterministic_and_correct_on_sampled_rows():
    """1,024 kv blocks of 64 tokens, 12.5 % density (128 per row): two runs bitwise equal,
    sampled query blocks match the reference."""
    torch.manual_seed(0)
    b, h, s, d, block = 1, 2, 65536, 128, 64
    nb = s // block
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    scores = torch.rand(b, h, nb, nb, device="cuda")
    block_map = fvc.topk_block_map(scores, nb // 8)
    sizes = torch.full((nb,), block, dtype=torch.int32, device="cuda")
    sizes[-3:] = torch.tensor([40, 1, 0], dtype=torch.int32)
    dout = torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)

    def run():
        qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        out, lse = fvc.block_sparse_attn(qq, kk, vv, block_map, sizes)
        return (out, lse) + torch.autograd.grad(out, (qq, kk, vv), dout)

    first, second = run(), run()
    for name, x, y in zip(("out", "lse", "dq", "dk", "dv"), first, second):
        assert torch.equal(x, y), f"{name} differs between two runs"
    rows = torch.tensor([0, 7, 500, nb - 1], device="cuda")
    tok = (rows[:, None] * block + torch.arange(block, device="cuda")).flatten()
    ref, ref_lse = block_sparse_attn_reference(q[:, :, tok], k, v, block_map[:, :, rows], sizes, block)
    err = _nerr(first[0][:, :, tok], ref)
    print(f"\n[triton 65536 tokens] sampled out nerr={err:.2e}")
    assert err < OUT_TOL
    torch.testing.assert_close(first[1][:, :, tok], ref_lse, atol=1e-2, rtol=1e-3)
    assert (first[3][:, :, -block:] == 0).all() and (first[4][:, :, -block - 63:] == 0).all()
