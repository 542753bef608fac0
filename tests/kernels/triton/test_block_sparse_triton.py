"""Triton block-sparse attention kernels (fwd + bwd) against the fp32 reference.

On CPU these run under TRITON_INTERPRET=1 (set by tests/conftest.py); shapes are tiny.
The interpreter's bf16 arithmetic is wrong, so bf16 is covered only by the ``gpu`` tests.

Error metric: max |got - ref| (absolute) for out/lse, and for gradients max |got - ref| /
max |ref| (normalised). Measured on this CPU under the interpreter and on an H200 (Triton 3.6,
this file's own cases); bound = measured x 2.5..20 headroom:
- fp32: out 3.3e-7..8.3e-7, lse 4.8e-7..9.5e-7 (~160 random problems; one early, not
  reproduced interpreter run read 4.4e-5), grads 2.9e-7..1.6e-6 -> OUT 1e-5, LSE 1e-4, GRAD 2e-5.
- fp16 (P and the output are rounded to fp16, unit roundoff 4.9e-4): out 2.6e-4..3.8e-4,
  lse <= 9.5e-7, grads 3.0e-4..5.9e-4 -> OUT 4e-3, LSE 2e-4, GRAD 8e-3.
- bf16 (gpu only; unit roundoff 3.9e-3, |out| up to ~2): out 2.3e-3..7.7e-3, lse <= 1.4e-6,
  grads 2.4e-3..4.6e-3 -> OUT 2e-2, LSE 1e-3, GRAD 3e-2.
"""

from __future__ import annotations

import pytest
import torch

from fastvideo_cute.kernels.triton._common import default_config, resolve_config
from fastvideo_cute.kernels.triton.block_sparse_bwd import block_sparse_attn_bwd
from fastvideo_cute.kernels.triton.block_sparse_fwd import block_sparse_attn_fwd
from fastvideo_cute.metadata import invert_indices, map_to_index
from fastvideo_cute.reference import block_sparse_attn_reference

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"

TOL = {  # (out abs, lse abs, grad normalised); see module docstring for the measurements
    torch.float32: (1e-5, 1e-4, 2e-5),
    torch.float16: (4e-3, 2e-4, 8e-3),
    torch.bfloat16: (2e-2, 1e-3, 3e-2),
}

# Small tiles so the interpreter walks the sub-tile paths (BLOCK_N < kv_block, BLOCK_M < q_block).
SUBTILE_CFG = {
    "fwd": {"BLOCK_M": 32, "BLOCK_N": 32},
    "bwd_pre": {"BLOCK_M": 32},
    "bwd_dq": {"BLOCK_M": 32, "BLOCK_N": 32},
    "bwd_dkdv": {"BLOCK_M": 32, "BLOCK_N": 32},
}


# ----------------------------------------------------------------------------------- helpers
class Problem:
    def __init__(self, b, h, qb_n, kvb_n, q_block, kv_block, d, dtype, *, sizes=None, block_map=None,
                 density=0.5, bshd=False, seed=0, device=DEV):
        gen = torch.Generator().manual_seed(seed)
        self.q_block, self.kv_block, self.d, self.dtype = q_block, kv_block, d, dtype
        sq, skv = qb_n * q_block, kvb_n * kv_block

        def mk(s):
            if bshd:  # [B, S, H, D] storage, passed as a [B, H, S, D] view
                return torch.randn(b, s, h, d, generator=gen).to(device, dtype).transpose(1, 2)
            return torch.randn(b, h, s, d, generator=gen).to(device, dtype)

        self.bshd = bshd
        self.q, self.k, self.v = mk(sq), mk(skv), mk(skv)
        self.dout = mk(sq)
        if sizes is None:
            sizes = torch.full((kvb_n,), kv_block, dtype=torch.int32)
        self.sizes = sizes.to(torch.int32).to(device)
        if block_map is None:
            block_map = torch.rand(b, h, qb_n, kvb_n, generator=gen) < density
        self.block_map = block_map.to(device)
        self.q2k_idx, self.q2k_num = (x.contiguous() for x in map_to_index(self.block_map))
        self.k2q_idx, self.k2q_num = (x.contiguous() for x in invert_indices(self.q2k_idx, self.q2k_num, kvb_n))
        # Filler slots past num are never read: poison them with an out-of-range block index and
        # add spare columns (the kernels must take the row width from the tensor).
        self.q2k_idx = _poison_filler(self.q2k_idx, self.q2k_num)
        self.k2q_idx = _poison_filler(self.k2q_idx, self.k2q_num)
        self.sm_scale = d ** -0.5
        pos = torch.arange(kv_block, device=device)
        self.kv_valid = (pos[None, :] < self.sizes.long()[:, None]).reshape(-1)  # [Skv]

    def new_like(self, x, fill=float("nan")):
        """Output buffer with ``x``'s layout (BSHD views stay views), pre-filled with garbage."""
        if self.bshd:
            return torch.full_like(x.transpose(1, 2), fill).transpose(1, 2)
        return torch.full_like(x, fill)

    def fwd(self, config=None):
        out = self.new_like(self.q)
        lse = torch.full(self.q.shape[:3], float("nan"), dtype=torch.float32, device=self.q.device)
        block_sparse_attn_fwd(self.q, self.k, self.v, self.q2k_idx, self.q2k_num, self.sizes, out, lse,
                              sm_scale=self.sm_scale, q_block=self.q_block, kv_block=self.kv_block, config=config)
        return out, lse

    def bwd(self, out, lse, config=None):
        dq, dk, dv = self.new_like(self.q), self.new_like(self.k), self.new_like(self.v)
        block_sparse_attn_bwd(self.q, self.k, self.v, out, self.dout, lse, self.q2k_idx, self.q2k_num,
                              self.k2q_idx, self.k2q_num, self.sizes, dq, dk, dv, sm_scale=self.sm_scale,
                              q_block=self.q_block, kv_block=self.kv_block, config=config)
        return dq, dk, dv

    def reference(self, with_grad=True, zero_padding=True):
        """fp32 reference; ``zero_padding`` zeroes padded K/V slots first (the contract says they
        are never read, so results must equal the zeroed run)."""
        keep = self.kv_valid.view(1, 1, -1, 1)
        k, v = self.k.float(), self.v.float()
        if zero_padding:
            k = torch.where(keep, k, torch.zeros((), device=k.device))
            v = torch.where(keep, v, torch.zeros((), device=v.device))
        q, k, v = (x.detach().clone().requires_grad_(with_grad) for x in (self.q.float(), k, v))
        out, lse = block_sparse_attn_reference(q, k, v, self.block_map, self.sizes, (self.q_block, self.kv_block),
                                               sm_scale=self.sm_scale)
        grads = None
        if with_grad:
            out.backward(self.dout.float())
            grads = (q.grad, k.grad, v.grad)
        return out.detach(), lse.detach(), grads


def _poison_filler(idx, num, extra=3, poison=2**30):
    wide = torch.full((*idx.shape[:-1], idx.shape[-1] + extra), poison, dtype=torch.int32, device=idx.device)
    used = torch.arange(idx.shape[-1], device=idx.device) < num.unsqueeze(-1)
    wide[..., : idx.shape[-1]] = torch.where(used, idx, torch.full_like(idx, poison))
    return wide.contiguous()


def _nerr(got, ref):
    return ((got.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()


def _check_against_reference(p: Problem, config=None, check_bwd=True):
    out_tol, lse_tol, grad_tol = TOL[p.dtype]
    ref_out, ref_lse, grads = p.reference(with_grad=check_bwd)
    out, lse = p.fwd(config)
    assert torch.isfinite(out).all()
    out_err = (out.float() - ref_out).abs().max().item()
    assert out_err <= out_tol, f"out err {out_err}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert not torch.isnan(lse).any()
    if fin.any():
        lse_err = (lse[fin] - ref_lse[fin]).abs().max().item()
        assert lse_err <= lse_tol, f"lse err {lse_err}"
    errs = {"out": out_err, "lse": lse_err if fin.any() else 0.0}
    if check_bwd:
        dq, dk, dv = p.bwd(out, lse, config)
        for name, got, ref in (("dq", dq, grads[0]), ("dk", dk, grads[1]), ("dv", dv, grads[2])):
            assert torch.isfinite(got).all(), name
            errs[name] = _nerr(got, ref)
            assert errs[name] <= grad_tol, f"{name} err {errs[name]}"
        # exact zeros where the contract says so
        pad = ~p.kv_valid
        assert (dk[:, :, pad] == 0).all() and (dv[:, :, pad] == 0).all()
        unselected = ~p.block_map.any(dim=2)  # [B, H, KVb]: kv blocks nobody selected
        rows = unselected.repeat_interleave(p.kv_block, dim=-1)
        assert (dk[rows] == 0).all() and (dv[rows] == 0).all()
        no_key = torch.isneginf(ref_lse)
        assert (dq[no_key] == 0).all()
        assert (out[no_key] == 0).all()
    return errs


def _ragged_sizes(n, block):
    """Full, partial, empty and 1-token kv blocks."""
    pattern = [block, block // 2 + 3, 0, 1, block, block - 1]
    return torch.tensor([pattern[i % len(pattern)] for i in range(n)], dtype=torch.int32)


# ------------------------------------------------------------------------- CPU / any device
@pytest.mark.parametrize(
    "dtype,q_block,kv_block,d,config",
    [
        (torch.float32, 64, 64, 32, None),
        (torch.float16, 64, 64, 64, None),
        (torch.float32, 128, 128, 32, None),
        (torch.float16, 128, 64, 32, SUBTILE_CFG),
        (torch.float32, 64, 128, 32, SUBTILE_CFG),
        (torch.float16, 64, 128, 64, None),
        (torch.float32, 128, 128, 64, {"fwd": {"BLOCK_N": 64}, "bwd_dq": {"BLOCK_M": 64}, "bwd_dkdv": {"BLOCK_M": 64}}),
    ],
)
def test_matches_reference(dtype, q_block, kv_block, d, config):
    """B=2, Sq != Skv, ragged sizes (0, 1, partial, full), a q block selecting nothing, a q
    block selecting only empty kv blocks, a kv block nobody selects."""
    b, h, qb_n, kvb_n = 2, 2, 3, 4
    gen = torch.Generator().manual_seed(1)
    sizes = _ragged_sizes(kvb_n, kv_block)  # block 2 is empty
    block_map = torch.rand(b, h, qb_n, kvb_n, generator=gen) < 0.6
    block_map[..., 0] = True
    block_map[0, 0, 1] = False  # selects nothing
    block_map[1, 1, 2] = False
    block_map[1, 1, 2, 2] = True  # selects only the empty kv block
    block_map[0, 1, :, 3] = False  # kv block 3 unselected in (0, 1)
    p = Problem(b, h, qb_n, kvb_n, q_block, kv_block, d, dtype, sizes=sizes, block_map=block_map, seed=2)
    errs = _check_against_reference(p, config)
    print(dtype, q_block, kv_block, d, errs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_bshd_strides(dtype):
    """BSHD storage passed as transposed views (inputs and outputs) gives bitwise the same
    result as contiguous BHSD, and matches the reference."""
    kw = dict(sizes=_ragged_sizes(3, 64), density=0.7, seed=3)
    pb = Problem(1, 2, 2, 3, 64, 64, 32, dtype, bshd=True, **kw)
    assert pb.q.stride(-1) == 1 and not pb.q.is_contiguous()
    pc = Problem(1, 2, 2, 3, 64, 64, 32, dtype, bshd=False, **kw)
    for name in ("q", "k", "v", "dout"):
        setattr(pc, name, getattr(pb, name).contiguous())
    _check_against_reference(pb)
    out_b, lse_b = pb.fwd()
    out_c, lse_c = pc.fwd()
    assert torch.equal(out_b, out_c) and torch.equal(lse_b, lse_c)
    for gb, gc in zip(pb.bwd(out_b, lse_b), pc.bwd(out_c, lse_c)):
        assert not gb.is_contiguous()
        assert torch.equal(gb, gc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_padding_nan_inf_never_leaks(dtype):
    """Padding keys hold NaN/+Inf/-Inf in K and V: results equal the zero-padded reference,
    everything finite, dk/dv of padding exactly 0."""
    kv_block = 64
    sizes = torch.tensor([64, 20, 0, 45], dtype=torch.int32)
    p = Problem(1, 2, 2, 4, 64, kv_block, 32, dtype, sizes=sizes, density=0.8, seed=4)
    pad = ~p.kv_valid
    npad = int(pad.sum())
    vals = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=dtype, device=p.k.device)
    fill = vals[torch.arange(npad, device=p.k.device) % 3].view(npad, 1).expand(npad, p.d)
    for t in (p.k, p.v):
        t[:, :, pad] = fill
    assert not torch.isfinite(p.k).all()
    _check_against_reference(p, SUBTILE_CFG)


@pytest.mark.filterwarnings("ignore:All-NaN slice")
def test_nan_in_q_row_propagates():
    """A NaN in one valid q row makes that output row NaN and nothing else; backward keeps
    padding-key and unselected-block gradients exactly 0."""
    sizes = torch.tensor([64, 33, 64], dtype=torch.int32)
    block_map = torch.tensor([[True, True, False], [False, True, False]]).view(1, 1, 2, 3)
    p = Problem(1, 1, 2, 3, 64, 64, 32, torch.float32, sizes=sizes, block_map=block_map, seed=5)
    p.q[0, 0, 5, 7] = float("nan")
    out, lse = p.fwd()
    assert torch.isnan(out[0, 0, 5]).all()
    assert torch.isnan(lse[0, 0, 5]), "the NaN row's lse is NaN (as the reference), not -inf"
    others = torch.ones(128, dtype=torch.bool)
    others[5] = False
    assert torch.isfinite(out[0, 0, others]).all()
    assert torch.isfinite(lse[0, 0, others]).all()
    ref_out, _, _ = p.reference(with_grad=False)
    assert (out[0, 0, others] - ref_out[0, 0, others]).abs().max() <= TOL[torch.float32][0]
    dq, dk, dv = p.bwd(out, lse)
    assert (dk[:, :, ~p.kv_valid] == 0).all() and (dv[:, :, ~p.kv_valid] == 0).all()
    assert (dk[:, :, 128:] == 0).all() and (dv[:, :, 128:] == 0).all()  # kv block 2 unselected
    assert torch.isfinite(dq[0, 0, 64:]).all()  # q block 1 shares no key with the NaN row's dq
    assert torch.isnan(dq[0, 0, 5]).all()  # the NaN row's own gradient is NaN, as in the reference


def test_no_valid_key_anywhere():
    """Every q block selects nothing or only empty blocks: out 0, lse -inf, all grads 0."""
    sizes = torch.tensor([0, 64], dtype=torch.int32)
    block_map = torch.tensor([[True, False], [False, False]]).view(1, 1, 2, 2)
    p = Problem(1, 1, 2, 2, 64, 64, 32, torch.float32, sizes=sizes, block_map=block_map, seed=6)
    out, lse = p.fwd()
    assert (out == 0).all() and torch.isneginf(lse).all()
    dq, dk, dv = p.bwd(out, lse)
    assert (dq == 0).all() and (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_deterministic(dtype):
    """Two runs give bitwise-identical forward and backward outputs."""
    p = Problem(1, 2, 2, 3, 64, 64, 32, dtype, sizes=_ragged_sizes(3, 64), density=0.8, seed=7)
    o1, l1 = p.fwd()
    g1 = p.bwd(o1, l1)
    o2, l2 = p.fwd()
    g2 = p.bwd(o2, l2)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def test_config_validation_and_defaults():
    for d in (32, 64, 128):
        for dt in (torch.float16, torch.bfloat16, torch.float32):
            for qb in (64, 128):
                for kb in (64, 128):
                    cfg = resolve_config(None, d, dt, qb, kb)
                    assert cfg == default_config(d, dt, qb, kb)
                    for sec in ("fwd", "bwd_dq", "bwd_dkdv"):
                        assert qb % cfg[sec]["BLOCK_M"] == 0 and kb % cfg[sec]["BLOCK_N"] == 0
    with pytest.raises(ValueError):
        resolve_config({"fwd": {"BLOCK_M": 128}}, 64, torch.float16, 64, 64)  # tile > q_block
    with pytest.raises(ValueError):
        resolve_config({"bwd_dkdv": {"BLOCK_N": 48}}, 64, torch.float16, 64, 64)
    with pytest.raises(ValueError):
        resolve_config({"bogus": 1}, 64, torch.float16, 64, 64)
    cfg = resolve_config({"BLOCK_N": 32, "num_warps": 2}, 64, torch.float16, 64, 64, flat_section="fwd")
    assert cfg["fwd"]["BLOCK_N"] == 32 and cfg["fwd"]["num_warps"] == 2


# ----------------------------------------------------------------------------------- GPU only
@pytest.mark.gpu
@pytest.mark.parametrize("q_block,kv_block", [(64, 64), (128, 128), (128, 64), (64, 128)])
@pytest.mark.parametrize("bshd", [False, True])
def test_gpu_bf16_parity(q_block, kv_block, bshd):
    b, h, d = 2, 3, 128
    qb_n, kvb_n = 1024 // q_block, 1536 // kv_block
    gen = torch.Generator().manual_seed(q_block + kv_block + bshd)
    sizes = torch.randint(0, kv_block + 1, (kvb_n,), generator=gen, dtype=torch.int32)
    sizes[::3] = kv_block
    block_map = torch.rand(b, h, qb_n, kvb_n, generator=gen) < 0.3
    block_map[0, 0, 0] = False
    p = Problem(b, h, qb_n, kvb_n, q_block, kv_block, d, torch.bfloat16, sizes=sizes, block_map=block_map,
                bshd=bshd, seed=8)
    errs = _check_against_reference(p)
    print("bf16", q_block, kv_block, bshd, errs)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_other_dtypes(dtype, d):
    sizes = _ragged_sizes(8, 128)
    p = Problem(1, 2, 6, 8, 128, 128, d, dtype, sizes=sizes, density=0.4, bshd=True, seed=9)
    errs = _check_against_reference(p)
    print(dtype, d, errs)


@pytest.mark.gpu
def test_gpu_padding_nan_and_determinism():
    sizes = _ragged_sizes(12, 64)
    p = Problem(2, 2, 8, 12, 64, 64, 128, torch.bfloat16, sizes=sizes, density=0.4, bshd=True, seed=10)
    pad = ~p.kv_valid
    p.k[:, :, pad] = float("nan")
    p.v[:, :, pad] = float("inf")
    _check_against_reference(p)
    o1, l1 = p.fwd()
    g1 = p.bwd(o1, l1)
    o2, l2 = p.fwd()
    g2 = p.bwd(o2, l2)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_gpu_int64_offsets():
    """Batch strides of 2^31 elements (q, out, dq, dout live in a 4 GiB buffer): the base
    offsets must be computed in int64."""
    p = Problem(2, 2, 4, 4, 64, 64, 64, torch.bfloat16, sizes=_ragged_sizes(4, 64), density=0.6, seed=12)
    big_stride = 2**31 + 64
    shape = tuple(p.q.shape)
    inner = shape[1] * shape[2] * shape[3]

    def big(src=None):
        buf = torch.full((big_stride + inner,), float("nan"), dtype=torch.bfloat16, device="cuda")
        x = buf.as_strided(shape, (big_stride, shape[2] * shape[3], shape[3], 1))
        if src is not None:
            x.copy_(src)
        return x

    q, dout = big(p.q), big(p.dout)
    out, dq = big(), big()
    lse = torch.empty(shape[:3], dtype=torch.float32, device="cuda")
    block_sparse_attn_fwd(q, p.k, p.v, p.q2k_idx, p.q2k_num, p.sizes, out, lse, sm_scale=p.sm_scale,
                          q_block=64, kv_block=64)
    dk, dv = torch.empty_like(p.k), torch.empty_like(p.v)
    block_sparse_attn_bwd(q, p.k, p.v, out, dout, lse, p.q2k_idx, p.q2k_num, p.k2q_idx, p.k2q_num, p.sizes,
                          dq, dk, dv, sm_scale=p.sm_scale, q_block=64, kv_block=64)
    ref_out, ref_lse, (rdq, rdk, rdv) = p.reference()
    out_tol, lse_tol, grad_tol = TOL[torch.bfloat16]
    assert (out.float() - ref_out).abs().max().item() <= out_tol
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse))
    for got, ref in ((dq, rdq), (dk, rdk), (dv, rdv)):
        assert torch.isfinite(got).all() and _nerr(got, ref) <= grad_tol
