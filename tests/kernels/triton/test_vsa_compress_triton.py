"""Fused compression kernel (``kernels/triton/vsa_compress.py``) against ``block_mean_reference``.

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py), called directly through
their launch helpers with BHSD views (a BSHD tensor as its ``transpose(1, 2)``). Ragged sizes
with size-0 and partial blocks, ``S_q != S_kv``, B = H = 2, NaN in every padding token.

Tolerances: the kernel sums in fp32 in another order than torch's ``sum``; measured max abs
error 0 on these shapes (fp16 and fp32 inputs, <= 16 terms), so 1e-5 / 1e-5 is headroom for
the rounding a different order may give. The
backward is a division per element (correctly rounded, like torch's) plus one rounding to the
grad dtype: exact in fp32 (checked ``torch.equal``), 1 fp16 ulp for fp16 (rtol 1e-3).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.kernels.triton.vsa_compress import vsa_compress_bwd, vsa_compress_fwd  # noqa: E402
from fastvideo_cute.reference import block_mean_reference  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
TOL = dict(atol=1e-5, rtol=1e-5)


def _bhsd(x, bshd):
    return x.transpose(1, 2) if bshd else x


def _tensor(b, h, s, d, dtype, bshd, sizes, block, seed):
    """Random call-layout tensor whose padding tokens hold NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((b, s, h, d) if bshd else (b, h, s, d), generator=g).to(DEV, dtype)
    xb = _bhsd(x, bshd)
    for n, size in enumerate(sizes.tolist()):
        xb[:, :, n * block + size:(n + 1) * block] = float("nan")
    return x


def _case(dtype, bshd, block=16, d=32, b=2, h=2, q_sizes=(16, 5, 0), kv_sizes=(0, 16, 3, 9)):
    qs = torch.tensor([min(s, block) for s in q_sizes], dtype=torch.int32, device=DEV)
    ks = torch.tensor([min(s, block) for s in kv_sizes], dtype=torch.int32, device=DEV)
    q = _tensor(b, h, len(q_sizes) * block, d, dtype, bshd, qs, block, 1)
    k = _tensor(b, h, len(kv_sizes) * block, d, dtype, bshd, ks, block, 2)
    v = _tensor(b, h, len(kv_sizes) * block, d, dtype, bshd, ks, block, 3)
    return q, k, v, qs, ks


def _fwd(q, k, v, qs, ks, block, bshd):
    b, h, d = q.shape[0], _bhsd(q, bshd).shape[1], q.shape[3]
    qc = torch.empty(b, h, qs.numel(), d, device=DEV)
    kc = torch.empty(b, h, ks.numel(), d, device=DEV)
    vc = torch.empty_like(kc)
    vsa_compress_fwd(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), qs, ks, qc, kc, vc, block=block)
    return qc, kc, vc


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bshd", [False, True])
def test_means_match_reference(dtype, bshd):
    q, k, v, qs, ks = _case(dtype, bshd)
    qc, kc, vc = _fwd(q, k, v, qs, ks, 16, bshd)
    for name, got, x, sizes in (("qc", qc, q, qs), ("kc", kc, k, ks), ("vc", vc, v, ks)):
        want = block_mean_reference(_bhsd(x, bshd), sizes, 16)
        assert torch.isfinite(got).all(), f"{name}: padding NaN leaked"
        torch.testing.assert_close(got, want, **TOL, msg=name)
    assert (qc[:, :, 2] == 0).all() and (kc[:, :, 0] == 0).all()  # size-0 blocks: mean exactly 0


@pytest.mark.parametrize("block,d", [(64, 256), (64, 24)])
def test_means_multi_chunk_and_odd_head_dim(block, d):
    """D=256: 32-token chunks (two per block); D=24: masked head_dim lanes."""
    q, k, v, qs, ks = _case(torch.float32, False, block=block, d=d, b=1, h=1, q_sizes=(64, 33), kv_sizes=(40,))
    qc, kc, vc = _fwd(q, k, v, qs, ks, block, False)
    torch.testing.assert_close(qc, block_mean_reference(q, qs, block), **TOL)
    torch.testing.assert_close(kc, block_mean_reference(k, ks, block), **TOL)
    torch.testing.assert_close(vc, block_mean_reference(v, ks, block), **TOL)


def _mean_grads(q, k, v, qs, ks, block, bshd, seed=7):
    """Reference gradients of sum(dxc * mean(x)) w.r.t. q, k, v (BHSD, fp32), and the dxc used."""
    g = torch.Generator().manual_seed(seed)
    outs, grads = [], []
    for x, sizes in ((q, qs), (k, ks), (v, ks)):
        xf = _bhsd(x, bshd).detach().float().requires_grad_(True)
        mean = block_mean_reference(xf, sizes, block)
        dxc = torch.randn(mean.shape, generator=g).to(DEV)
        outs.append(dxc)
        grads.append(torch.autograd.grad(mean, xf, dxc)[0])
    return outs, grads


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bshd", [False, True])
def test_backward_write_mode(dtype, bshd):
    q, k, v, qs, ks = _case(dtype, bshd)
    dxcs, want = _mean_grads(q, k, v, qs, ks, 16, bshd)
    outs = [torch.full_like(x, float("nan")) for x in (q, k, v)]  # every token must be written
    vsa_compress_bwd(*dxcs, qs, ks, *[_bhsd(o, bshd) for o in outs], block=16, accumulate=False)
    for name, got, w in zip("qkv", outs, want):
        got = _bhsd(got, bshd)
        if dtype == torch.float32:
            assert torch.equal(got, w), f"d{name}"
        else:
            torch.testing.assert_close(got.float(), w, atol=0, rtol=1e-3, msg=f"d{name}")
    # padding tokens get exact 0 (the reference's where-mask gives 0 there too)
    assert (_bhsd(outs[0], bshd)[:, :, 16 + 5:] == 0).all()
    assert (_bhsd(outs[1], bshd)[:, :, :16] == 0).all()


@pytest.mark.parametrize("bshd", [False, True])
def test_backward_accumulate_leaves_padding_untouched(bshd):
    dtype = torch.float32
    q, k, v, qs, ks = _case(dtype, bshd)
    dxcs, want = _mean_grads(q, k, v, qs, ks, 16, bshd)
    g = torch.Generator().manual_seed(11)
    base = [torch.randn(x.shape, generator=g).to(DEV, dtype) for x in (q, k, v)]
    for x, sizes in zip(base, (qs, ks, ks)):  # sentinels in padding: NaN and -0.0 must survive bit for bit
        xb = _bhsd(x, bshd)
        for n, size in enumerate(sizes.tolist()):
            xb[:, :, n * 16 + size:(n + 1) * 16] = float("nan") if n % 2 else -0.0
    acc = [x.clone() for x in base]
    vsa_compress_bwd(*dxcs, qs, ks, *[_bhsd(a, bshd) for a in acc], block=16, accumulate=True)
    for name, got, start, w, sizes in zip("qkv", acc, base, want, (qs, ks, ks)):
        got, start = _bhsd(got, bshd), _bhsd(start, bshd)
        pos = torch.arange(got.shape[2], device=DEV)
        valid = (pos % 16 < sizes.repeat_interleave(16)).view(1, 1, -1, 1).expand_as(got)
        torch.testing.assert_close(got[valid], (start + w)[valid], atol=1e-6, rtol=1e-6, msg=f"d{name}")
        assert torch.equal(got[~valid].view(torch.int32), start[~valid].view(torch.int32)), f"d{name} padding"


def test_backward_partial_pairs_and_determinism():
    """Only dq and dv (dk skipped); two runs are bitwise equal."""
    q, k, v, qs, ks = _case(torch.float32, False)
    dxcs, want = _mean_grads(q, k, v, qs, ks, 16, False)
    runs = []
    for _ in range(2):
        dq, dv = torch.empty_like(q), torch.empty_like(v)
        vsa_compress_bwd(dxcs[0], None, dxcs[2], qs, ks, dq, None, dv, block=16, accumulate=False)
        runs.append((dq, dv))
    assert torch.equal(runs[0][0], want[0]) and torch.equal(runs[0][1], want[2])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    a = _fwd(q, k, v, qs, ks, 16, False)
    b = _fwd(q, k, v, qs, ks, 16, False)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# ---------------------------------------------------------------- tuning configs (bench_glue.py sweeps them)

SAME_BITS = [dict(mode="split"), dict(mode="preload"), dict(mode="split", evict_first=True),
             dict(mode="preload", evict_first=True), dict(mode="fused", evict_first=True)]


@pytest.mark.parametrize("cfg", SAME_BITS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("bshd", [False, True])
def test_forward_configs_equal_default_bitwise(cfg, dtype, bshd):
    """The program splits and the cache hint keep each block's chunking and sum: the default's
    bits exactly (and the reference within TOL); S_q != S_kv (program axes past Qb), NaN padding."""
    q, k, v, qs, ks = _case(dtype, bshd)
    want = _fwd(q, k, v, qs, ks, 16, bshd)
    b, h, d = q.shape[0], _bhsd(q, bshd).shape[1], q.shape[3]
    got = [torch.full((b, h, n, d), float("nan"), device=DEV) for n in (qs.numel(), ks.numel(), ks.numel())]
    vsa_compress_fwd(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), qs, ks, *got, block=16, config=cfg)
    for name, g, w, x, sizes in zip(("qc", "kc", "vc"), got, want, (q, k, v), (qs, ks, ks)):
        assert torch.equal(g, w), name
        torch.testing.assert_close(g, block_mean_reference(_bhsd(x, bshd), sizes, 16), **TOL, msg=name)


@pytest.mark.parametrize("cfg,match", [
    (dict(mode="fast"), "mode"),
    (dict(block_t=12), "block_t"),
    (dict(block_t=32), "block_t"),
    (dict(mode="preload", block_t=8), "preload"),
    (dict(num_warps=3), "num_warps"),
    (dict(warps=4), "unknown"),
])
def test_forward_bad_config(cfg, match):
    q, k, v, qs, ks = _case(torch.float32, False)
    qc, kc, vc = (torch.empty(2, 2, n, 32, device=DEV) for n in (3, 4, 4))
    with pytest.raises(ValueError, match=match):
        vsa_compress_fwd(q, k, v, qs, ks, qc, kc, vc, block=16, config=cfg)


@pytest.mark.parametrize("mode,bshd", [("split", False), ("fused", True)])
def test_fwd_writes_k_v_with_padding_zeroed_and_the_same_means(mode, bshd):
    """``k_out`` / ``v_out``: the valid rows copied bit for bit, every padding row (NaN in the
    input) exactly 0, in both program modes; the block means equal the call without them.
    block_t 4 < block: the zero loop starts inside a partial chunk (sizes 3 and 9)."""
    block = 16
    q, k, v, qs, ks = _case(torch.float16, bshd)
    cfg = {"mode": mode, "block_t": 4}
    ref = []
    for with_out in (False, True):
        b, h, d = q.shape[0], _bhsd(q, bshd).shape[1], q.shape[3]
        qc = torch.empty(b, h, qs.numel(), d, device=DEV)
        kc = torch.empty(b, h, ks.numel(), d, device=DEV)
        vc = torch.empty_like(kc)
        outs = [torch.full_like(k, 7.0), torch.full_like(v, 7.0)] if with_out else [None, None]
        vsa_compress_fwd(_bhsd(q, bshd), _bhsd(k, bshd), _bhsd(v, bshd), qs, ks, qc, kc, vc, block=block,
                         config=cfg, k_out=None if outs[0] is None else _bhsd(outs[0], bshd),
                         v_out=None if outs[1] is None else _bhsd(outs[1], bshd))
        ref.append((qc, kc, vc, outs))
    for a, c in zip(ref[0][:3], ref[1][:3]):
        assert torch.equal(a, c)
    for x, out in zip((k, v), ref[1][3]):
        xb, ob = _bhsd(x, bshd), _bhsd(out, bshd)
        for n, size in enumerate(ks.tolist()):
            assert torch.equal(ob[:, :, n * block:n * block + size], xb[:, :, n * block:n * block + size])
            pad = ob[:, :, n * block + size:(n + 1) * block]
            assert torch.equal(pad, torch.zeros_like(pad))


def test_fwd_k_out_is_refused_with_preload():
    q, k, v, qs, ks = _case(torch.float32, False)
    qc = torch.empty(2, 2, 3, 32, device=DEV)
    kc = torch.empty(2, 2, 4, 32, device=DEV)
    with pytest.raises(AssertionError, match="needs mode"):
        vsa_compress_fwd(q, k, v, qs, ks, qc, kc, torch.empty_like(kc), block=16, config={"mode": "preload"},
                         v_out=torch.empty_like(v))
