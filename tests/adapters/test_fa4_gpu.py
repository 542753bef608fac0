"""FA4 adapter on a GPU (sm_90 / sm_100): forward and backward against the fp32 reference.

Run on the GPU box (after the wheel install of shared/gpu/README.md):
    . /tmp/fvc/env.sh && python3 -m pytest -q -rs -s tests/adapters/test_fa4_gpu.py

Tolerances (bf16 inputs, fp32 reference on the same bf16 values), with their origin: the FastVideo
FA4 adapter's GB200 parity tests (design reference 003) accepted out avg_abs < 1e-3 and
max_rel < 0.2, and gradients avg_abs < 2e-2 and max_rel < 0.5, where max_rel = max|diff| /
mean|ref|. The same metrics are used here; every check prints its measured values.
"""

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # collected on CPU boxes too; conftest skips "gpu" items there
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("flash_attn.cute", reason="flash-attn-4 (flash_attn.cute) is not importable")

from fastvideo_cute.adapters import fa4 as A  # noqa: E402
from fastvideo_cute.reference import block_sparse_attn_reference  # noqa: E402

DEV = "cuda"
ARCH = torch.cuda.get_device_capability()
OUT_TOL = (1e-3, 0.2)
GRAD_TOL = (2e-2, 0.5)


def _need(block, grad):
    ok, reason = A.fa4_support(ARCH, torch.bfloat16, 128, block, block, grad)
    if not ok:
        pytest.skip(f"FA4 route does not serve block {block} (grad={grad}) on sm_{ARCH[0]}{ARCH[1]}: {reason}")


def _metrics(ref: torch.Tensor, got: torch.Tensor):
    diff = (ref.float() - got.float()).abs()
    return diff.mean().item(), (diff.max() / (ref.float().abs().mean() + 1e-6)).item()


def _check(tag, ref, got, tol):
    assert torch.isfinite(got).all(), f"{tag}: non-finite values"
    avg_abs, max_rel = _metrics(ref, got)
    print(f"  {tag}: avg_abs={avg_abs:.3e} max_rel={max_rel:.3e}")
    assert avg_abs < tol[0], f"{tag}: avg_abs {avg_abs:.3e} >= {tol[0]}"
    assert max_rel < tol[1], f"{tag}: max_rel {max_rel:.3e} >= {tol[1]}"


def _make(block, b=1, h=2, d=128, qb=3, kvb=5, seed=0, sizes=None, layout="bshd"):
    """Inputs for FA4 (BSHD; for layout='bhsd' strided views of BHSD storage) and for the reference."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    sq, skv = qb * block, kvb * block
    qh, kh, vh = (torch.randn(b, h, s, d, generator=g).to(DEV, torch.bfloat16) for s in (sq, skv, skv))
    if sizes is None:
        sizes = [block, block - 37, 0, 1, block][:kvb] + [block] * max(0, kvb - 5)
    sizes = torch.tensor(sizes, dtype=torch.int32, device=DEV)
    block_map = torch.rand(b, h, qb, kvb, generator=g).to(DEV) < 0.5
    block_map[:, :, :, 0] |= torch.rand(b, h, qb, generator=g).to(DEV) < 0.5
    block_map[0, 0, 0] = False  # selects nothing
    if qb > 1:
        block_map[0, h - 1, 1] = False
        block_map[0, h - 1, 1, 2] = True  # selects only a size-0 block
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2) for t in (qh, kh, vh))  # strided BSHD views, no copy
    else:
        q, k, v = (t.transpose(1, 2).contiguous() for t in (qh, kh, vh))
    return q, k, v, block_map, sizes


def _reference(q, k, v, block_map, sizes, block, dout=None):
    """fp32 reference on the same bf16 values (BHSD); grads when dout (BSHD) is given."""
    qr, kr, vr = (t.transpose(1, 2).float().detach().requires_grad_(dout is not None) for t in (q, k, v))
    out, lse = block_sparse_attn_reference(qr, kr, vr, block_map, sizes, block_size=(block, block))
    grads = None
    if dout is not None:
        (out * dout.transpose(1, 2).float()).sum().backward()
        grads = tuple(t.grad.transpose(1, 2) for t in (qr, kr, vr))
    return out.transpose(1, 2).detach(), lse.detach(), grads


def _empty_rows(block_map, sizes, block):
    """[B, H, Sq] bool: rows with no valid key."""
    valid_block = block_map & (sizes > 0).view(1, 1, 1, -1)
    return valid_block.any(-1).logical_not().repeat_interleave(block, dim=-1)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("block", [64, 128, 256])
def test_forward_matches_reference(block, layout):
    _need(block, False)
    q, k, v, block_map, sizes = _make(block, b=2, layout=layout, seed=block)
    out, lse = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=block, need_backward=False)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == (2, 2, q.shape[1]) and lse.dtype == torch.float32
    ref_out, ref_lse, _ = _reference(q, k, v, block_map, sizes, block)
    print(f"[fwd block={block} {layout} sm_{ARCH[0]}{ARCH[1]}]")
    _check("out", ref_out, out, OUT_TOL)
    empty = _empty_rows(block_map, sizes, block)
    assert empty.any() and (~empty).any()
    # Rows with no valid key: exactly 0 and lse = -inf (FA4's empty-tile path; no conversion).
    out_bhsd = out.transpose(1, 2)
    assert torch.equal(out_bhsd[empty], torch.zeros_like(out_bhsd[empty]))
    assert torch.isneginf(lse[empty]).all()
    # LSE is natural log and matches the reference on every other row.
    lse_err = (lse[~empty] - ref_lse[~empty]).abs().max().item()
    print(f"  lse: max_abs={lse_err:.3e}")
    assert lse_err < 1e-2


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("block", [128, 256])
def test_backward_matches_reference(block, layout):
    _need(block, True)
    q, k, v, block_map, sizes = _make(block, layout=layout, seed=10 + block)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16)
    out, lse = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=block, need_backward=True)
    dq, dk, dv = A.fa4_block_sparse_bwd(q, k, v, out, dout, lse, block_map, sizes, block_size=block)
    ref_out, _, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes, block, dout=dout)
    print(f"[bwd block={block} {layout} sm_{ARCH[0]}{ARCH[1]}]")
    _check("out", ref_out, out, OUT_TOL)
    for name, ref, got in (("dq", rdq, dq), ("dk", rdk, dk), ("dv", rdv, dv)):
        assert got.shape == ref.shape
        _check(name, ref, got, GRAD_TOL)
    empty = _empty_rows(block_map, sizes, block)
    assert torch.equal(dq.transpose(1, 2)[empty], torch.zeros_like(dq.transpose(1, 2)[empty]))
    # keys past kv_block_sizes get no gradient
    pos = torch.arange(block, device=DEV)
    pad = (pos[None, :] >= sizes[:, None]).reshape(-1)
    assert torch.count_nonzero(dk[:, pad]) == 0 and torch.count_nonzero(dv[:, pad]) == 0


@pytest.mark.parametrize("block", [128, 256])
def test_q_len_differs_from_kv_len_and_partial_tiles(block):
    _need(block, True)
    sizes = [block, block // 2 + 3, block, 5, 0, block - 1, block]
    q, k, v, block_map, sizes_t = _make(block, qb=2, kvb=7, sizes=sizes, seed=3)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16)
    out, lse = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes_t, block_size=block, need_backward=True)
    dq, dk, dv = A.fa4_block_sparse_bwd(q, k, v, out, dout, lse, block_map, sizes_t, block_size=block)
    ref_out, _, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes_t, block, dout=dout)
    print(f"[cross block={block}]")
    _check("out", ref_out, out, OUT_TOL)
    for name, ref, got in (("dq", rdq, dq), ("dk", rdk, dk), ("dv", rdv, dv)):
        _check(name, ref, got, GRAD_TOL)


@pytest.mark.parametrize("block", [64, 128, 256])
def test_inference_forward_equals_training_forward_bitwise(block):
    _need(block, False)
    q, k, v, block_map, sizes = _make(block, seed=5)
    out_i, lse_i = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=block, need_backward=False)
    if A.fa4_support(ARCH, torch.bfloat16, 128, block, block, True)[0]:
        out_t, lse_t = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=block, need_backward=True)
    else:
        out_t, lse_t = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=block, need_backward=False)
    assert torch.equal(out_i, out_t)
    assert torch.equal(lse_i, lse_t)


def test_nan_padding_with_zero_kv_padding():
    """Keys past kv_block_sizes holding NaN/Inf must not reach valid rows. FA4 reads a partial
    tile whole (0 * NaN in P @ V), so the adapter's ``zero_kv_padding=True`` is needed for it;
    the default path is characterised and printed, not asserted."""
    block = 128
    _need(block, True)
    q, k, v, block_map, sizes = _make(block, seed=9)
    pos = torch.arange(block, device=DEV)
    pad = (pos[None, :] >= sizes[:, None]).reshape(-1)
    k_bad, v_bad = k.clone(), v.clone()
    k_bad[:, pad] = float("nan")
    v_bad[:, pad] = float("inf")
    ref_out, _, _ = _reference(q, k, v, block_map, sizes, block)
    raw, _ = A.fa4_block_sparse_fwd(q, k_bad, v_bad, block_map, sizes, block_size=block, need_backward=False)
    print(f"[nan padding] default path: non-finite outputs = {int((~torch.isfinite(raw)).sum())}")
    out, lse = A.fa4_block_sparse_fwd(q, k_bad, v_bad, block_map, sizes, block_size=block, need_backward=True,
                                      zero_kv_padding=True)
    _check("out", ref_out, out, OUT_TOL)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16)
    dq, dk, dv = A.fa4_block_sparse_bwd(q, k_bad, v_bad, out, dout, lse, block_map, sizes, block_size=block,
                                        zero_kv_padding=True)
    _, _, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes, block, dout=dout)
    for name, ref, got in (("dq", rdq, dq), ("dk", rdk, dk), ("dv", rdv, dv)):
        _check(name, ref, got, GRAD_TOL)


def test_65536_tokens_sampled_rows():
    """B=1, H=2, 65,536 tokens, 128-token blocks, 12.5 % of blocks: sampled q blocks vs the reference."""
    block = 128
    _need(block, True)
    s, h, d = 65536, 2, 128
    n = s // block
    topk = n // 8
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(1, s, h, d, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(3))
    scores = torch.rand(1, h, n, n, device=DEV, generator=g)
    block_map = torch.zeros(1, h, n, n, dtype=torch.bool, device=DEV)
    block_map.scatter_(-1, scores.topk(topk, dim=-1).indices, True)
    sizes = torch.full((n,), block, dtype=torch.int32, device=DEV)
    sizes[-1] = 77
    out, lse = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=block, need_backward=True)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16, generator=g)
    dq, dk, dv = A.fa4_block_sparse_bwd(q, k, v, out, dout, lse, block_map, sizes, block_size=block)
    assert all(torch.isfinite(t).all() for t in (out, lse, dq, dk, dv))
    rows = torch.tensor([0, 1, n // 2, n - 1], device=DEV)
    q_sub = q.view(1, n, block, h, d)[:, rows].reshape(1, -1, h, d)
    ref_out, ref_lse, _ = _reference(q_sub, k, v, block_map[:, :, rows], sizes, block)
    got = out.view(1, n, block, h, d)[:, rows].reshape(1, -1, h, d)
    print("[65536 tokens]")
    _check("out", ref_out, got, OUT_TOL)
    lse_sub = lse.view(1, h, n, block)[:, :, rows].reshape(1, h, -1)
    assert (lse_sub - ref_lse).abs().max().item() < 1e-2
    # dq of the sampled rows: the reference restricted to those q blocks gives the same dq rows.
    qr, kr, vr = (t.transpose(1, 2).float().requires_grad_() for t in (q_sub, k, v))
    ro, _ = block_sparse_attn_reference(qr, kr, vr, block_map[:, :, rows], sizes, block_size=(block, block))
    dsub = dout.view(1, n, block, h, d)[:, rows].reshape(1, -1, h, d)
    (ro * dsub.transpose(1, 2).float()).sum().backward()
    _check("dq[sampled]", qr.grad.transpose(1, 2), dq.view(1, n, block, h, d)[:, rows].reshape(1, -1, h, d),
           GRAD_TOL)


def test_softmax_scale_default_is_inverse_sqrt_head_dim():
    block = 128
    _need(block, False)
    q, k, v, block_map, sizes = _make(block, seed=4)
    a, _ = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=block, need_backward=False)
    b, _ = A.fa4_block_sparse_fwd(q, k, v, block_map, sizes, block_size=block, need_backward=False,
                                  softmax_scale=1.0 / math.sqrt(q.shape[-1]))
    assert torch.equal(a, b)
