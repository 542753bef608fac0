"""Fused gate kernels (``kernels/triton/vsa_gate.py``) against ``gate_compose_reference`` and its
autograd gradients.

On CPU the kernels run under TRITON_INTERPRET=1 (tests/conftest.py), with BHSD views (a BSHD
tensor as its ``transpose(1, 2)``). B = H = 2, three 16-token q blocks.

Tolerances: the kernel computes ``out_s + gate * out_c`` in fp32 and rounds once, the
reference is fp32: measured error 0 in fp32 (out, d_gate, d_out_c; bound 1e-5 for a different
summation order of d_out_c's 16 terms); fp16 outputs are one rounding of the fp32 value
(measured max rel error 4.8e-4 <= 2^-11): rtol 1e-3, atol 1e-3 for values near 0.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.kernels.triton.vsa_gate import vsa_gate_bwd, vsa_gate_fwd  # noqa: E402
from fastvideo_cute.reference import gate_compose_reference  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
B, H, QB, BLOCK, D = 2, 2, 3, 16, 32


def _bhsd(x, bshd):
    return x.transpose(1, 2) if bshd else x


def _tol(dtype):
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-3, rtol=1e-3)


def _inputs(dtype, oc_dtype, bshd, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (B, QB * BLOCK, H, D) if bshd else (B, H, QB * BLOCK, D)
    out_s = torch.randn(shape, generator=g).to(DEV, dtype)
    gate = torch.randn(shape, generator=g).to(DEV, dtype)
    out_c = torch.randn(B, H, QB, D, generator=g).to(DEV, oc_dtype)
    return out_s, out_c, gate


@pytest.mark.parametrize("dtype,oc_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                            (torch.float16, torch.float32)])
@pytest.mark.parametrize("bshd", [False, True])
@pytest.mark.parametrize("with_gate", [True, False])
def test_forward_matches_reference(dtype, oc_dtype, bshd, with_gate):
    out_s, out_c, gate = _inputs(dtype, oc_dtype, bshd)
    gate = gate if with_gate else None
    out = torch.full_like(out_s, float("nan"))  # every element must be written
    vsa_gate_fwd(_bhsd(out_s, bshd), out_c, _bhsd(gate, bshd) if gate is not None else None, _bhsd(out, bshd),
                 block=BLOCK)
    want = gate_compose_reference(_bhsd(out_s, bshd), out_c, _bhsd(gate, bshd) if gate is not None else None, BLOCK)
    torch.testing.assert_close(_bhsd(out, bshd).float(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("bshd", [False, True])
@pytest.mark.parametrize("with_gate", [True, False])
def test_backward_matches_autograd_of_reference(dtype, bshd, with_gate):
    out_s, out_c, gate = _inputs(dtype, dtype, bshd, seed=1)
    gate = gate if with_gate else None
    dout = torch.randn(out_s.shape, generator=torch.Generator().manual_seed(2)).to(DEV, dtype)
    d_gate = torch.full_like(out_s, float("nan")) if with_gate else None
    d_out_c = torch.full_like(out_c, float("nan"))
    vsa_gate_bwd(_bhsd(dout, bshd), out_c, _bhsd(gate, bshd) if with_gate else None,
                 _bhsd(d_gate, bshd) if with_gate else None, d_out_c, block=BLOCK)
    oc = out_c.float().requires_grad_(True)
    gf = _bhsd(gate, bshd).float().requires_grad_(True) if with_gate else None
    ref = gate_compose_reference(_bhsd(out_s, bshd).float(), oc, gf, BLOCK)
    leaves = (oc, gf) if with_gate else (oc,)
    want = torch.autograd.grad(ref, leaves, _bhsd(dout, bshd).float())
    torch.testing.assert_close(d_out_c.float(), want[0], **_tol(dtype))
    if with_gate:
        torch.testing.assert_close(_bhsd(d_gate, bshd).float(), want[1], **_tol(dtype))


def test_backward_without_d_gate_and_determinism():
    """With a gate but no d_gate wanted only d_out_c is written; two runs are bitwise equal."""
    out_s, out_c, gate = _inputs(torch.float32, torch.float32, False, seed=3)
    dout = torch.randn_like(out_s)
    runs = []
    for _ in range(2):
        d_out_c = torch.empty_like(out_c)
        vsa_gate_bwd(dout, out_c, gate, None, d_out_c, block=BLOCK)
        runs.append(d_out_c)
    assert torch.equal(runs[0], runs[1])
    want = (dout * gate).view(B, H, QB, BLOCK, D).sum(3)
    torch.testing.assert_close(runs[0], want, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- tuning configs (bench_glue.py sweeps them)

@pytest.mark.parametrize("cfg", [dict(block_t=8), dict(block_t=16, evict_first=True), dict(block_t=32, num_warps=8)],
                         ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype,oc_dtype", [(torch.float32, torch.float32), (torch.float16, torch.float32)])
@pytest.mark.parametrize("bshd", [False, True])
@pytest.mark.parametrize("with_gate", [True, False])
def test_forward_configs_equal_default_bitwise(cfg, dtype, oc_dtype, bshd, with_gate):
    """Smaller tiles, several q blocks per program (block_t 32 = 2 blocks of 16; S = 48 would not
    divide 32, so 4 blocks here), the cache hint: one expression per element, the default's bits."""
    g = torch.Generator().manual_seed(4)
    shape = (B, 4 * BLOCK, H, D) if bshd else (B, H, 4 * BLOCK, D)
    out_s, gate = (torch.randn(shape, generator=g).to(DEV, dtype) for _ in range(2))
    out_c = torch.randn(B, H, 4, D, generator=g).to(DEV, oc_dtype)
    gate = gate if with_gate else None
    outs = []
    for c in (None, cfg):
        out = torch.full_like(out_s, float("nan"))
        vsa_gate_fwd(_bhsd(out_s, bshd), out_c, _bhsd(gate, bshd) if gate is not None else None, _bhsd(out, bshd),
                     block=BLOCK, config=c)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    want = gate_compose_reference(_bhsd(out_s, bshd), out_c, _bhsd(gate, bshd) if gate is not None else None, BLOCK)
    torch.testing.assert_close(_bhsd(outs[1], bshd).float(), want, **_tol(dtype))


@pytest.mark.parametrize("cfg,match", [
    (dict(block_t=12), "block_t"),
    (dict(block_t=48), "block_t"),
    (dict(block_t=64), "block_t"),  # 4 blocks of 16 do not divide S = 48
    (dict(num_warps=5), "num_warps"),
    (dict(bt=4), "unknown"),
])
def test_forward_bad_config(cfg, match):
    out_s, out_c, gate = _inputs(torch.float32, torch.float32, False)
    with pytest.raises(ValueError, match=match):
        vsa_gate_fwd(out_s, out_c, gate, torch.empty_like(out_s), block=BLOCK, config=cfg)
