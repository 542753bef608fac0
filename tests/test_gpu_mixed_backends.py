"""On a GPU: the forward and the backward of one call on different backends (what the route
table may choose) agree with the fp32 reference, because every backend that returns an LSE
follows one contract (natural log, fp32 [B, H, S_q], -inf for rows without a key)."""

import dataclasses
import json

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import ops, route_table
from fastvideo_cute.backends import BACKENDS
from fastvideo_cute.call import call_info
from fastvideo_cute.padding_probe import probe_counts
from fastvideo_cute.reference import block_sparse_attn_reference

pytestmark = pytest.mark.gpu
OUT_TOL, GRAD_TOL = 1e-2, 2e-2  # bf16 vs fp32 reference (tests/test_gpu_cute_route.py)


def _nerr(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()


PAIRS = [(128, "fa4", "triton"), (128, "triton", "fa4"), (128, "cudnn", "triton"), (128, "fa4", "cudnn"),
         (128, "cudnn", "fa4"), (128, "triton", "cudnn"),
         # the sm90 64-token forward with the backwards the table pairs it with, and its own
         # warp-specialized backward after each 64-token forward
         (64, "sm90", "cudnn"), (64, "sm90", "triton"), (64, "sm90", "sm90"), (64, "cudnn", "sm90"),
         (64, "triton", "sm90"),
         # ... and at 128/256-token blocks (run as the 64-token tiles that cover them)
         (128, "sm90", "cudnn"), (128, "sm90", "fa4"), (256, "sm90", "cudnn"), (256, "sm90", "fa4"),
         (256, "sm90", "triton")]


def _route_pair(tmp_path, monkeypatch, q, k, block, fwd, bwd, bshd):
    """A route table that sends this call's forward to ``fwd`` and its backward to ``bwd`` (skips
    when either cannot serve or is not verified on this GPU); returns the public function."""
    d = q.shape[-1]
    info = call_info(q, k, block, True, bshd, True, None)
    # what the router asks each backend (routes._direction_call): the forward direction of a
    # training call with an LSE, the backward the whole call
    for name, call in ((fwd, dataclasses.replace(info, need_grad=False, need_lse=True)), (bwd, info)):
        ok, why = BACKENDS[name].support(call)
        if not ok:
            pytest.skip(f"{name}: {why}")
    cap = torch.cuda.get_device_capability()
    if not (BACKENDS[fwd].verified_on(cap) and BACKENDS[bwd].verified_on(cap)):
        pytest.skip("the table only picks backends verified on this arch")
    arch = "sm_{}{}".format(*cap)
    table = {"schema": 1, "source": "test", "measured_with": {}, "entries": [
        {"arch": arch, "block_size": block, "direction": "fwd", "tiles": "partial", "head_dim": d, "order": [fwd]},
        {"arch": arch, "block_size": block, "direction": "bwd", "tiles": "partial", "head_dim": d, "order": [bwd]}]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(route_table.TABLE_ENV, str(path))
    for var in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(var, raising=False)
    return {(64, False): fvc.block_sparse_attn, (64, True): fvc.block_sparse_attn_bshd,
            (128, False): fvc.block_sparse_attn_128, (128, True): fvc.block_sparse_attn_128_bshd,
            (256, False): fvc.block_sparse_attn_256, (256, True): fvc.block_sparse_attn_256_bshd}[(block, bshd)]


def _probed(fwd: str, bwd: str) -> bool:
    """Whether the forward probes K/V padding for the backward (ops._probe_padding): only the
    backward's backend would copy K/V to zero their padding."""
    return (not getattr(BACKENDS[fwd], "zeroes_kv_padding", False)) and getattr(BACKENDS[bwd], "zeroes_kv_padding",
                                                                                 False)


def _run_observed(fn, q, k, v, m, sizes, fwd, bwd):
    """Forward and backward of one call, asserting they ran on ``fwd`` and ``bwd`` (the ops'
    dispatch counter); returns ``(out, lse, dout, (dq, dk, dv))``."""
    before = ops.dispatch_counts.copy()
    out, lse = fn(q, k, v, m, sizes)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ran = {key: n - before[key] for key, n in ops.dispatch_counts.items() if n != before[key]}
    assert ran == {(fwd, "fwd"): 1, (bwd, "bwd"): 1}, ran
    return out, lse, dout, grads


@pytest.mark.parametrize("block,fwd,bwd", PAIRS)
@pytest.mark.parametrize("bshd", [False, True])
def test_forward_and_backward_on_different_backends(tmp_path, monkeypatch, block, fwd, bwd, bshd):
    torch.manual_seed(7)
    b, h, d, nb = 2, 2, 128, 4
    shape = (b, nb * block, h, d) if bshd else (b, h, nb * block, d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    sizes = torch.tensor([block, block // 2 + 6, 0, block], dtype=torch.int32, device="cuda")
    m = torch.rand(b, h, nb, nb, device="cuda") < 0.6
    m[0, 1, 2] = False  # a row with no block
    fn = _route_pair(tmp_path, monkeypatch, q, k, block, fwd, bwd, bshd)
    out, lse, dout, grads = _run_observed(fn, q, k, v, m, sizes, fwd, bwd)
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    ref, ref_lse = block_sparse_attn_reference(tb(q), tb(k), tb(v), m, sizes, block)
    refg = torch.autograd.grad(ref, (q, k, v), tb(dout).float())
    errs = [_nerr(tb(out), ref)] + [_nerr(g, r) for g, r in zip(grads, refg)]
    print(f"\n[{fwd}>{bwd} bshd={bshd}] " + " ".join(f"{e:.2e}" for e in errs))
    assert errs[0] < OUT_TOL and max(errs[1:]) < GRAD_TOL
    assert torch.equal(torch.isneginf(lse), ~torch.isfinite(ref_lse))


# The pairs whose backward reads partial kv tiles whole (FA4, cuDNN: padding-zeroed copies), with the
# forward before each that the route table pairs it with or that shares the copies (fa4 > fa4).
POISON_PAIRS = [(128, "sm90", "fa4"), (256, "sm90", "fa4"), (128, "fa4", "fa4"), (64, "sm90", "cudnn"),
                (128, "sm90", "cudnn"), (256, "sm90", "cudnn"), (128, "cudnn", "cudnn"),
                # the sm90 backward masks padded keys in its kernel (no copy): after its own forward
                # and after cuDNN's (whose forward reads V's padding-zeroed copy)
                (64, "sm90", "sm90"), (64, "cudnn", "sm90")]


@pytest.mark.parametrize("block,fwd,bwd", POISON_PAIRS)
@pytest.mark.parametrize("bshd", [False, True])
def test_nan_inf_padding_reaches_no_output_and_no_gradient(tmp_path, monkeypatch, block, fwd, bwd, bshd):
    """NaN in K's padding rows and Inf in V's (positions past each kv block's size): the output and
    all three gradients stay finite and match the fp32 reference on the finite inputs; padded keys
    get dk = dv = 0 exactly; the gradients come back contiguous in the call layout."""
    torch.manual_seed(11)
    b, h, d, nb = 1, 2, 128, 4  # an even block count: the sm90 backward's preprocess pairs blocks
    shape = (b, nb * block, h, d) if bshd else (b, h, nb * block, d)
    sizes = torch.tensor([block // 2 + 3, block, 17, 9], dtype=torch.int32, device="cuda")
    pos = torch.arange(nb * block, device="cuda")
    pad = (pos % block) >= sizes.repeat_interleave(block)  # [S]: padding rows
    pad_v = pad.view(1, -1, 1, 1) if bshd else pad.view(1, 1, -1, 1)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k_fin = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v_fin = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k = torch.where(pad_v, float("nan"), k_fin)
    v = torch.where(pad_v, float("inf"), v_fin)
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    m = torch.rand(b, h, nb, nb, device="cuda") < 0.7
    m[0, :, :, 2:] = True  # every row sees the two most-padded blocks
    fn = _route_pair(tmp_path, monkeypatch, q, k, block, fwd, bwd, bshd)
    before = probe_counts.copy()
    out, lse, dout, grads = _run_observed(fn, q, k, v, m, sizes, fwd, bwd)
    probed = {key: n - before[key] for key, n in probe_counts.items() if n != before[key]}
    # the forward probes the padding where only the backward would copy it, and reads "not zero"
    assert probed == ({"launched": 1, "nonzero": 1} if _probed(fwd, bwd) else {}), probed
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)
    for g, x in zip(grads, (q, k, v)):
        assert g.shape == x.shape and g.is_contiguous(), (g.shape, g.stride())
    assert (grads[1][pad_v.expand_as(grads[1])] == 0).all() and (grads[2][pad_v.expand_as(grads[2])] == 0).all()
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    qr, kr, vr = (x.detach().clone().requires_grad_(True) for x in (q, k_fin, v_fin))
    ref, _ = block_sparse_attn_reference(tb(qr), tb(kr), tb(vr), m, sizes, block)
    refg = torch.autograd.grad(ref, (qr, kr, vr), tb(dout).float())
    errs = [_nerr(tb(out), ref)] + [_nerr(g, r) for g, r in zip(grads, refg)]
    print(f"\n[poisoned {fwd}>{bwd} bshd={bshd}] " + " ".join(f"{e:.2e}" for e in errs))
    assert errs[0] < OUT_TOL and max(errs[1:]) < GRAD_TOL


# The pairs whose forward does not copy K/V but whose backward would (the route table's partial-tile
# classes on the H200: sm90 forwards before cuDNN backwards (v8), FA4 where cuDNN cannot), and a
# Triton forward.
PROBE_PAIRS = [(64, "sm90", "cudnn"), (128, "sm90", "cudnn"), (128, "sm90", "fa4"), (256, "sm90", "cudnn"),
               (256, "sm90", "fa4"), (128, "triton", "fa4")]


@pytest.mark.parametrize("block,fwd,bwd", PROBE_PAIRS)
@pytest.mark.parametrize("bshd", [False, True])
def test_zero_padding_is_probed_and_not_copied(tmp_path, monkeypatch, block, fwd, bwd, bshd):
    """K/V whose padding rows are zero (what a tiler writes): the forward's probe reads "zero", the
    backward runs on K and V as they are (no padding-zeroed copy is made anywhere in the call), and
    output and gradients match the fp32 reference; padded keys get dk = dv = 0."""
    import fastvideo_cute.kernels.triton.sanitize_padding as sp

    torch.manual_seed(13)
    b, h, d, nb = 2, 2, 128, 4
    shape = (b, nb * block, h, d) if bshd else (b, h, nb * block, d)
    sizes = torch.tensor([block // 2 + 3, block, 17, 9], dtype=torch.int32, device="cuda")
    pos = torch.arange(nb * block, device="cuda")
    pad = (pos % block) >= sizes.repeat_interleave(block)
    pad_v = pad.view(1, -1, 1, 1) if bshd else pad.view(1, 1, -1, 1)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.where(pad_v, 0.0, torch.randn(shape, device="cuda")).to(torch.bfloat16) for _ in range(2))
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    m = torch.rand(b, h, nb, nb, device="cuda") < 0.7
    m[:, :, :, 2:] = True
    m[1, 0, 1] = False  # a row with no block
    fn = _route_pair(tmp_path, monkeypatch, q, k, block, fwd, bwd, bshd)
    copies = []
    real = sp.sanitize_kv_padding
    monkeypatch.setattr(sp, "sanitize_kv_padding", lambda *a, **kw: copies.append(1) or real(*a, **kw))
    before = probe_counts.copy()
    out, lse, dout, grads = _run_observed(fn, q, k, v, m, sizes, fwd, bwd)
    probed = {key: n - before[key] for key, n in probe_counts.items() if n != before[key]}
    assert probed == {"launched": 1, "zero": 1}, probed
    assert copies == []
    assert (grads[1][pad_v.expand_as(grads[1])] == 0).all() and (grads[2][pad_v.expand_as(grads[2])] == 0).all()
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    ref, ref_lse = block_sparse_attn_reference(tb(q), tb(k), tb(v), m, sizes, block)
    refg = torch.autograd.grad(ref, (q, k, v), tb(dout).float())
    errs = [_nerr(tb(out), ref)] + [_nerr(g, r) for g, r in zip(grads, refg)]
    print(f"\n[probed {fwd}>{bwd} bshd={bshd}] " + " ".join(f"{e:.2e}" for e in errs))
    assert errs[0] < OUT_TOL and max(errs[1:]) < GRAD_TOL
    assert torch.equal(torch.isneginf(lse), ~torch.isfinite(ref_lse))
