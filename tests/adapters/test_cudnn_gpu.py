"""cuDNN BSA adapter on a GPU: forward and backward against the fp32 reference.

Run on the GPU box (CuTe stack of shared/gpu/README.md plus nvidia-cudnn-frontend==1.32.0):
    . /tmp/fvc/env.sh && PYTHONPATH=$PWD:$PYTHONPATH python3 -m pytest -q -rs -s tests/adapters/test_cudnn_gpu.py
Timing of the padding sanitizer against the kernels (prints, asserts nothing):
    PYTHONPATH=$PWD:$PYTHONPATH python3 tests/adapters/test_cudnn_gpu.py --bench

Tolerances (bf16 inputs, fp32 reference on the same bf16 values) are those of
tests/adapters/test_fa4_gpu.py, with their origin: the FastVideo FA4 adapter's GB200 parity tests
(design reference 003) accepted out avg_abs < 1e-3 and max_rel < 0.2, gradients avg_abs < 2e-2
and max_rel < 0.5, where max_rel = max|diff| / mean|ref|; LSE max_abs < 1e-2. Gradients also get
an elementwise bf16 rounding allowance: max_rel is taken over |diff| - 2^-7 |ref| (the outputs are
bf16, whose rounding alone is up to 2^-8 |value|: 2x headroom). Without it the metric failed on
correct results: a q block whose only valid key is one token gives that key's dV the sum of 64-256
dO rows (|dV| ~ 16-40, 250x mean|ref|), whose bf16 rounding (0.06-0.11, measured on the H200
2026-12-01 with the fp32 reference at every other entry within 4e-3) exceeded 0.5 x mean|ref|.
Every check prints its measured values. Padding (keys past kv_block_sizes) holds NaN/Inf in the NaN tests and must
not reach any output; padded keys must get dk = dv = 0 exactly, rows with no valid key out = 0,
lse = -inf and dq = 0 exactly.
"""

import math
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

if __name__ != "__main__" and not torch.cuda.is_available():  # collected on CPU boxes too
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from fastvideo_cute.adapters import cudnn_bsa as C  # noqa: E402
from fastvideo_cute.adapters.cudnn_bsa_support import cudnn_support  # noqa: E402
from fastvideo_cute.metadata import map_to_index  # noqa: E402
from fastvideo_cute.reference import block_sparse_attn_reference  # noqa: E402

try:
    C.load_cudnn()
except ImportError as exc:  # pragma: no cover - depends on the box
    if __name__ != "__main__":
        pytest.skip(f"cuDNN BSA not importable: {str(exc).splitlines()[0]}", allow_module_level=True)
    raise

DEV = "cuda"
ARCH = torch.cuda.get_device_capability()
OUT_TOL = (1e-3, 0.2)
GRAD_TOL = (2e-2, 0.5, 2.0 ** -7)  # (avg_abs, max_rel, elementwise rtol): see the docstring
LSE_TOL = 1e-2


def _need(block, grad, *, d=128, dtype=torch.bfloat16, q_len=None, kv_len=None, full=False):
    q_len = q_len or 4 * block
    kv_len = kv_len or 4 * block
    ok, reason = cudnn_support(ARCH, dtype, d, block, grad, q_len=q_len, kv_len=kv_len, heads_q=2, heads_kv=2,
                               bshd=True, kv_all_full=full)
    if not ok:
        pytest.skip(f"cuDNN does not serve block {block} grad={grad} on sm_{ARCH[0]}{ARCH[1]}: {reason}")


def _metrics(ref, got, rtol=0.0):
    """(mean |diff|, max(|diff| - rtol |ref|) / mean |ref|)."""
    ref, got = ref.float(), got.float()
    diff = (ref - got).abs()
    return diff.mean().item(), ((diff - rtol * ref.abs()).max() / (ref.abs().mean() + 1e-6)).item()


def _check(tag, ref, got, tol):
    assert torch.isfinite(got).all(), f"{tag}: {int((~torch.isfinite(got)).sum())} non-finite values"
    avg_abs, max_rel = _metrics(ref, got, tol[2] if len(tol) > 2 else 0.0)
    print(f"  {tag}: avg_abs={avg_abs:.3e} max_rel={max_rel:.3e}" + (f" (rtol {tol[2]:.4f})" if len(tol) > 2 else ""))
    assert avg_abs < tol[0], f"{tag}: avg_abs {avg_abs:.3e} >= {tol[0]}"
    assert max_rel < tol[1], f"{tag}: max_rel {max_rel:.3e} >= {tol[1]}"


def _bhsd(x, layout):
    return x.transpose(1, 2) if layout == "bshd" else x


def _make(block, *, b=2, h=2, d=128, qb=3, kvb=5, seed=0, sizes=None, layout="bshd", full=False,
          dtype=torch.bfloat16):
    """q/k/v in the call layout ('bshd': contiguous [B,S,H,D]; 'bhsd': contiguous [B,H,S,D];
    'bhsd_view': strided [B,H,S,D] views of BSHD storage), a map with an empty row and a row that
    selects only a size-0 block, and ragged sizes (full, partial, 0, 1)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    sq, skv = qb * block, kvb * block
    qh, kh, vh = (torch.randn(b, h, s, d, generator=g).to(DEV, dtype) for s in (sq, skv, skv))
    if full:
        sizes = [block] * kvb
    elif sizes is None:
        sizes = ([block, block - 37, 0, 1, block] * ((kvb + 4) // 5))[:kvb]
    sizes = torch.tensor(sizes, dtype=torch.int32, device=DEV)
    block_map = torch.rand(b, h, qb, kvb, generator=g).to(DEV) < 0.5
    block_map[:, :, :, 0] |= torch.rand(b, h, qb, generator=g).to(DEV) < 0.5
    block_map[0, 0, 0] = False  # selects nothing
    if qb > 1 and not full and kvb > 2:
        block_map[b - 1, h - 1, 1] = False
        block_map[b - 1, h - 1, 1, 2] = True  # selects only a size-0 block
    if layout == "bhsd":
        q, k, v = qh, kh, vh
    elif layout == "bhsd_view":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (qh, kh, vh))
    else:
        q, k, v = (t.transpose(1, 2).contiguous() for t in (qh, kh, vh))
    return q, k, v, block_map, sizes


def _poison_padding(k, v, sizes, block, layout):
    """NaN in K's padding, +Inf/-Inf in V's (out of place)."""
    pos = torch.arange(block, device=DEV)
    pad = (pos[None, :] >= sizes[:, None]).reshape(-1)
    k_bad, v_bad = k.clone(), v.clone()
    kb, vb = _bhsd(k_bad, "bshd" if layout == "bshd" else "bhsd"), _bhsd(v_bad, "bshd" if layout == "bshd" else "bhsd")
    kb[:, :, pad] = float("nan")
    vb[:, :, pad] = float("inf")
    vb[:, :, pad, ::2] = float("-inf")
    return k_bad, v_bad


def _layout_kw(layout):
    return dict(bshd=(layout == "bshd"))


def _reference(q, k, v, block_map, sizes, block, layout, dout=None):
    """fp32 reference on the same bf16 values (BHSD); grads (in the call layout) when dout is given."""
    lay = "bshd" if layout == "bshd" else "bhsd"
    qr, kr, vr = (_bhsd(t, lay).float().detach().requires_grad_(dout is not None) for t in (q, k, v))
    out, lse = block_sparse_attn_reference(qr, kr, vr, block_map, sizes, block_size=(block, block))
    grads = None
    if dout is not None:
        (out * _bhsd(dout, lay).float()).sum().backward()
        grads = tuple(_bhsd(t.grad, lay) for t in (qr, kr, vr))
    return _bhsd(out, lay).detach(), lse.detach(), grads


def _empty_rows(block_map, sizes, block):
    """[B, H, Sq] bool: rows with no valid key."""
    valid_block = block_map & (sizes > 0).view(1, 1, 1, -1)
    return valid_block.any(-1).logical_not().repeat_interleave(block, dim=-1)


def _fwd(q, k, v, block_map, sizes, block, layout, *, all_full, need_backward):
    idx, num = map_to_index(block_map)
    return C.cudnn_block_sparse_fwd(q, k, v, idx, num, sizes, block_size=block, softmax_scale=q.shape[-1] ** -0.5,
                                    all_full=all_full, need_backward=need_backward, **_layout_kw(layout))


def _bwd(dout, q, k, v, out, lse, block_map, sizes, block, layout, *, all_full, saved):
    idx, num = map_to_index(block_map)
    return C.cudnn_block_sparse_bwd(dout, q, k, v, out, lse, idx, num, sizes, block_size=block,
                                    softmax_scale=q.shape[-1] ** -0.5, all_full=all_full, saved=saved,
                                    **_layout_kw(layout))


def _assert_contiguous_like(x, like):
    want = torch.empty_like(like, memory_format=torch.contiguous_format)
    assert x.shape == want.shape and x.dtype == want.dtype and x.stride() == want.stride(), \
        f"{tuple(x.shape)} {x.stride()} vs {tuple(want.shape)} {want.stride()}"


@pytest.mark.parametrize("layout", ["bshd", "bhsd", "bhsd_view"])
@pytest.mark.parametrize("block", [64, 128, 256])
def test_forward_matches_reference(block, layout):
    _need(block, False)
    q, k, v, block_map, sizes = _make(block, layout=layout, seed=block)
    out, lse, saved = _fwd(q, k, v, block_map, sizes, block, layout, all_full=False, need_backward=False)
    _assert_contiguous_like(out, q)
    assert lse.shape == (2, 2, 3 * block) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert saved.k is None and saved.v is not None  # inference: V alone is sanitized
    ref_out, ref_lse, _ = _reference(q, k, v, block_map, sizes, block, layout)
    print(f"[fwd block={block} {layout} sm_{ARCH[0]}{ARCH[1]}]")
    _check("out", ref_out, out, OUT_TOL)
    empty = _empty_rows(block_map, sizes, block)
    assert empty.any() and (~empty).any()
    out_bhsd = _bhsd(out, "bshd" if layout == "bshd" else "bhsd")
    assert torch.equal(out_bhsd[empty], torch.zeros_like(out_bhsd[empty]))
    assert torch.isneginf(lse[empty]).all()
    lse_err = (lse[~empty] - ref_lse[~empty]).abs().max().item()
    print(f"  lse: max_abs={lse_err:.3e}")
    assert lse_err < LSE_TOL


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("block", [64, 128, 256])
def test_backward_matches_reference(block, layout):
    _need(block, True)
    q, k, v, block_map, sizes = _make(block, layout=layout, seed=10 + block)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16)
    out, lse, saved = _fwd(q, k, v, block_map, sizes, block, layout, all_full=False, need_backward=True)
    assert saved.k is not None and saved.v is not None
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, block_map, sizes, block, layout, all_full=False, saved=saved)
    ref_out, _, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes, block, layout, dout=dout)
    print(f"[bwd block={block} {layout} sm_{ARCH[0]}{ARCH[1]}]")
    _check("out", ref_out, out, OUT_TOL)
    for name, ref, got, like in (("dq", rdq, dq, q), ("dk", rdk, dk, k), ("dv", rdv, dv, v)):
        _assert_contiguous_like(got, like)
        _check(name, ref, got, GRAD_TOL)
    lay = "bshd" if layout == "bshd" else "bhsd"
    empty = _empty_rows(block_map, sizes, block)
    dq_b = _bhsd(dq, lay)
    assert torch.equal(dq_b[empty], torch.zeros_like(dq_b[empty]))
    pos = torch.arange(block, device=DEV)
    pad = (pos[None, :] >= sizes[:, None]).reshape(-1)
    assert torch.count_nonzero(_bhsd(dk, lay)[:, :, pad]) == 0 and torch.count_nonzero(_bhsd(dv, lay)[:, :, pad]) == 0


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("block", [64, 128, 256])
def test_nan_inf_padding_never_leaks(block, layout):
    """NaN/Inf in K/V padding: out and dq/dk/dv finite and equal to the clean reference; the
    backward once with the forward's sanitized copies, once without them (it sanitizes itself)."""
    _need(block, True)
    q, k, v, block_map, sizes = _make(block, layout=layout, seed=20 + block)
    k_bad, v_bad = _poison_padding(k, v, sizes, block, layout)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16)
    ref_out, ref_lse, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes, block, layout, dout=dout)
    print(f"[nan padding block={block} {layout}]")
    # what cuDNN does without the adapter's sanitizing (characterised, not asserted)
    idx, num = map_to_index(block_map)
    seq_dim = 1 if layout == "bshd" else 2
    meta = C.build_cudnn_metadata(idx, num, sizes, block_size=block, batch=2, heads=2, q_len=q.shape[seq_dim],
                                  kv_len=k.shape[seq_dim], all_full=False)
    raw, _ = C.cudnn_fwd_prebuilt(q, k_bad, v_bad, meta, bshd=(layout == "bshd"), softmax_scale=None)
    print(f"  raw cuDNN forward, poisoned padding: non-finite outputs = {int((~torch.isfinite(raw)).sum())}")
    for need_backward in (False, True):
        out, lse, saved = _fwd(q, k_bad, v_bad, block_map, sizes, block, layout, all_full=False,
                               need_backward=need_backward)
        _check(f"out (need_backward={need_backward})", ref_out, out, OUT_TOL)
        empty = _empty_rows(block_map, sizes, block)
        assert (lse[~empty] - ref_lse[~empty]).abs().max().item() < LSE_TOL
        assert torch.isneginf(lse[empty]).all()
    lay = "bshd" if layout == "bshd" else "bhsd"
    pos = torch.arange(block, device=DEV)
    pad = (pos[None, :] >= sizes[:, None]).reshape(-1)
    for use_saved in (True, False):
        dq, dk, dv = _bwd(dout, q, k_bad, v_bad, out, lse, block_map, sizes, block, layout, all_full=False,
                          saved=saved if use_saved else None)
        for name, ref, got in (("dq", rdq, dq), ("dk", rdk, dk), ("dv", rdv, dv)):
            _check(f"{name} (saved={use_saved})", ref, got, GRAD_TOL)
        assert torch.count_nonzero(_bhsd(dk, lay)[:, :, pad]) == 0
        assert torch.count_nonzero(_bhsd(dv, lay)[:, :, pad]) == 0


@pytest.mark.parametrize("block", [64, 128, 256])
def test_inference_forward_equals_training_forward_bitwise(block):
    """K padding cannot leak in the forward (scores are masked by select), so sanitizing V alone
    (inference) and K + V (training) give the same bits, even with NaN in K's padding."""
    _need(block, False)
    q, k, v, block_map, sizes = _make(block, seed=30 + block)
    k_bad, v_bad = _poison_padding(k, v, sizes, block, "bshd")
    out_i, lse_i, _ = _fwd(q, k_bad, v_bad, block_map, sizes, block, "bshd", all_full=False, need_backward=False)
    grad_ok = cudnn_support(ARCH, torch.bfloat16, 128, block, True, q_len=q.shape[1], kv_len=k.shape[1], heads_q=2,
                            heads_kv=2, bshd=True)[0]
    if not grad_ok:
        pytest.skip("no backward here: the training forward is not served")
    out_t, lse_t, _ = _fwd(q, k_bad, v_bad, block_map, sizes, block, "bshd", all_full=False, need_backward=True)
    assert torch.equal(out_i, out_t) and torch.equal(lse_i, lse_t)


@pytest.mark.parametrize("block", [64, 128, 256])
def test_all_full_blocks_without_block_sizes(block):
    """all_full=True: no block_sizes tensor is passed (cuDNN's unmasked variant) and nothing is
    sanitized; B > 1 with an empty row."""
    _need(block, True, full=True)
    q, k, v, block_map, sizes = _make(block, b=3, seed=40 + block, full=True)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16)
    out, lse, saved = _fwd(q, k, v, block_map, sizes, block, "bshd", all_full=True, need_backward=True)
    assert saved.k is None and saved.v is None and saved.meta.block_sizes is None
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, block_map, sizes, block, "bshd", all_full=True, saved=saved)
    ref_out, _, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes, block, "bshd", dout=dout)
    print(f"[all full block={block}]")
    _check("out", ref_out, out, OUT_TOL)
    for name, ref, got in (("dq", rdq, dq), ("dk", rdk, dk), ("dv", rdv, dv)):
        _check(name, ref, got, GRAD_TOL)


@pytest.mark.parametrize("block", [64, 128])
def test_finite_padding_promise_skips_the_copy(block):
    """padding_finite=True (zeros in the padding, as to_tiles writes): nothing is sanitized and the
    results still match the reference, forward and backward."""
    _need(block, True)
    q, k, v, block_map, sizes = _make(block, seed=80 + block)
    pos = torch.arange(block, device=DEV)
    pad = (pos[None, :] >= sizes[:, None]).reshape(-1)
    k, v = k.clone(), v.clone()
    k[:, pad] = 0
    v[:, pad] = 0
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16)
    idx, num = map_to_index(block_map)
    out, lse, saved = C.cudnn_block_sparse_fwd(q, k, v, idx, num, sizes, block_size=block, bshd=True,
                                               softmax_scale=None, all_full=False, need_backward=True,
                                               padding_finite=True)
    assert saved.k is None and saved.v is None
    dq, dk, dv = C.cudnn_block_sparse_bwd(dout, q, k, v, out, lse, idx, num, sizes, block_size=block, bshd=True,
                                          softmax_scale=None, all_full=False, saved=saved, padding_finite=True)
    ref_out, _, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes, block, "bshd", dout=dout)
    print(f"[finite padding block={block}]")
    _check("out", ref_out, out, OUT_TOL)
    for name, ref, got in (("dq", rdq, dq), ("dk", rdk, dk), ("dv", rdv, dv)):
        _check(name, ref, got, GRAD_TOL)
    assert torch.count_nonzero(dk[:, pad]) == 0 and torch.count_nonzero(dv[:, pad]) == 0


@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("qb, kvb", [(2, 7), (5, 2)])
def test_q_len_differs_from_kv_len(block, qb, kvb):
    _need(block, True, q_len=qb * block, kv_len=kvb * block)
    sizes = ([block, block // 2 + 3, block, 5, 0, block - 1, block])[:kvb]
    q, k, v, block_map, sizes_t = _make(block, qb=qb, kvb=kvb, sizes=sizes, seed=3 + qb)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16)
    out, lse, saved = _fwd(q, k, v, block_map, sizes_t, block, "bshd", all_full=False, need_backward=True)
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, block_map, sizes_t, block, "bshd", all_full=False, saved=saved)
    ref_out, _, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes_t, block, "bshd", dout=dout)
    print(f"[cross block={block} qb={qb} kvb={kvb}]")
    _check("out", ref_out, out, OUT_TOL)
    for name, ref, got in (("dq", rdq, dq), ("dk", rdk, dk), ("dv", rdv, dv)):
        _check(name, ref, got, GRAD_TOL)


@pytest.mark.parametrize("d", [64, 96])
def test_other_head_dims_forward(d):
    block = 128
    _need(block, False, d=d)
    q, k, v, block_map, sizes = _make(block, d=d, seed=50 + d)
    out, lse, _ = _fwd(q, k, v, block_map, sizes, block, "bshd", all_full=False, need_backward=False)
    ref_out, _, _ = _reference(q, k, v, block_map, sizes, block, "bshd")
    print(f"[fwd d={d}]")
    _check("out", ref_out, out, OUT_TOL)


def test_fp16_forward():
    block = 64
    _need(block, False, dtype=torch.float16)
    q, k, v, block_map, sizes = _make(block, seed=60, dtype=torch.float16)
    out, _, _ = _fwd(q, k, v, block_map, sizes, block, "bshd", all_full=False, need_backward=False)
    assert out.dtype == torch.float16
    ref_out, _, _ = _reference(q, k, v, block_map, sizes, block, "bshd")
    print("[fwd fp16]")
    _check("out", ref_out, out, OUT_TOL)


def test_nan_in_a_visible_q_row_propagates():
    """A NaN in q is data: the rows that hold it get NaN out (and NaN lse on sm_90/sm_100)."""
    block = 64
    _need(block, False)
    q, k, v, block_map, sizes = _make(block, seed=70)
    block_map[1, 0, 2, 0] = True  # q block 2 of (1, 0) sees kv block 0 (full)
    q = q.clone()
    q[1, 2 * block + 5, 0, 3] = float("nan")
    out, lse, _ = _fwd(q, k, v, block_map, sizes, block, "bshd", all_full=False, need_backward=False)
    assert torch.isnan(out[1, 2 * block + 5, 0]).all()
    assert torch.isfinite(out[1, 2 * block + 4, 0]).all()
    print(f"[nan q row] lse of the row = {lse[1, 0, 2 * block + 5].item()}")
    if ARCH[0] != 12:  # cuDNN's SM120 finalizer writes -inf for a NaN row sum
        assert torch.isnan(lse[1, 0, 2 * block + 5])


def test_long_sequence_sampled_rows():
    """B=1, H=2, 16384 tokens, 64-token blocks, ~12.5 % of blocks, ragged tail: sampled q blocks."""
    block = 64
    s, h, d = 16384, 2, 128
    _need(block, True, q_len=s, kv_len=s)
    n = s // block
    g = torch.Generator(device=DEV).manual_seed(0)
    q, k, v = (torch.randn(1, s, h, d, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(3))
    scores = torch.rand(1, h, n, n, device=DEV, generator=g)
    block_map = torch.zeros(1, h, n, n, dtype=torch.bool, device=DEV)
    block_map.scatter_(-1, scores.topk(n // 8, dim=-1).indices, True)
    sizes = torch.full((n,), block, dtype=torch.int32, device=DEV)
    sizes[-1] = 17
    sizes[n // 2] = 0
    k_bad, v_bad = _poison_padding(k, v, sizes, block, "bshd")
    out, lse, saved = _fwd(q, k_bad, v_bad, block_map, sizes, block, "bshd", all_full=False, need_backward=True)
    dout = torch.randn(q.shape, device=DEV, dtype=torch.bfloat16, generator=g)
    dq, dk, dv = _bwd(dout, q, k_bad, v_bad, out, lse, block_map, sizes, block, "bshd", all_full=False, saved=saved)
    assert all(torch.isfinite(t).all() for t in (out, dq, dk, dv))
    rows = torch.tensor([0, 1, n // 2, n - 1], device=DEV)
    q_sub = q.view(1, n, block, h, d)[:, rows].reshape(1, -1, h, d)
    qr, kr, vr = (t.transpose(1, 2).float().requires_grad_() for t in (q_sub, k, v))
    ro, rl = block_sparse_attn_reference(qr, kr, vr, block_map[:, :, rows], sizes, block_size=(block, block))
    dsub = dout.view(1, n, block, h, d)[:, rows].reshape(1, -1, h, d)
    (ro * dsub.transpose(1, 2).float()).sum().backward()
    print("[16384 tokens]")
    got = out.view(1, n, block, h, d)[:, rows].reshape(1, -1, h, d)
    _check("out[sampled]", ro.transpose(1, 2).detach(), got, OUT_TOL)
    lse_sub = lse.view(1, h, n, block)[:, :, rows].reshape(1, h, -1)
    assert (lse_sub - rl).abs().max().item() < LSE_TOL
    _check("dq[sampled]", qr.grad.transpose(1, 2), dq.view(1, n, block, h, d)[:, rows].reshape(1, -1, h, d), GRAD_TOL)


@pytest.mark.parametrize("block,nb", [(64, 448), (128, 300), (256, 150)])
def test_one_q_group_backward_matches_reference(block, nb):
    """Lengths where the adapter runs cuDNN's backward as one q group and cuDNN's default would use
    several (cudnn_bwd_bucket: 448 blk64 q blocks > 384; 300 blk128 > 256, also for 256-token blocks
    as 128-token tiles): every gradient against the fp32 reference, ragged sizes, B = H = 1."""
    from fastvideo_cute.adapters.cudnn_bsa_support import CUDNN_PHYSICAL_TILE, cudnn_bwd_bucket

    s, d = nb * block, 128
    _need(block, True, q_len=s, kv_len=s)
    tile = CUDNN_PHYSICAL_TILE[block]
    if cudnn_bwd_bucket(ARCH, tile, s) is None:
        pytest.skip(f"no one-group policy on sm_{ARCH[0]}{ARCH[1]}")
    assert s // tile > (384 if tile == 64 else 256)  # cuDNN's default would split the q blocks
    g = torch.Generator(device=DEV).manual_seed(block)
    q, k, v, dout = (torch.randn(1, s, 1, d, device=DEV, dtype=torch.bfloat16, generator=g) for _ in range(4))
    scores = torch.rand(1, 1, nb, nb, device=DEV, generator=g)
    block_map = torch.zeros(1, 1, nb, nb, dtype=torch.bool, device=DEV)
    block_map.scatter_(-1, scores.topk(max(1, nb // 8), dim=-1).indices, True)
    sizes = torch.full((nb,), block, dtype=torch.int32, device=DEV)
    sizes[::7] = block // 2 + 5
    out, lse, saved = _fwd(q, k, v, block_map, sizes, block, "bshd", all_full=False, need_backward=True)
    dq, dk, dv = _bwd(dout, q, k, v, out, lse, block_map, sizes, block, "bshd", all_full=False, saved=saved)
    ref_out, _, (rdq, rdk, rdv) = _reference(q, k, v, block_map, sizes, block, "bshd", dout=dout)
    print(f"[one q group block={block} S={s}]")
    _check("out", ref_out, out, OUT_TOL)
    for name, ref, got in (("dq", rdq, dq), ("dk", rdk, dk), ("dv", rdv, dv)):
        _check(name, ref, got, GRAD_TOL)


def test_softmax_scale_none_is_inverse_sqrt_head_dim():
    block = 128
    _need(block, False)
    q, k, v, block_map, sizes = _make(block, seed=4)
    idx, num = map_to_index(block_map)
    a, _, _ = C.cudnn_block_sparse_fwd(q, k, v, idx, num, sizes, block_size=block, bshd=True, softmax_scale=None,
                                       all_full=False)
    b, _, _ = C.cudnn_block_sparse_fwd(q, k, v, idx, num, sizes, block_size=block, bshd=True,
                                       softmax_scale=1.0 / math.sqrt(q.shape[-1]), all_full=False)
    assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# python tests/adapters/test_cudnn_gpu.py --bench : the padding sanitizer's cost vs the kernels
# ---------------------------------------------------------------------------------------------


def _bench():
    from triton.testing import do_bench

    from fastvideo_cute.kernels.triton.sanitize_padding import sanitize_kv_padding

    torch.manual_seed(0)
    b, h, d = 1, 12, 128
    print(f"GPU {torch.cuda.get_device_name()} sm_{ARCH[0]}{ARCH[1]} cudnn-frontend "
          f"{C.load_cudnn().versions}", flush=True)
    for s, block in ((32768, 64), (32768, 128), (65536, 64), (65536, 128)):
        n = s // block
        q, k, v = (torch.randn(b, s, h, d, device=DEV, dtype=torch.bfloat16) for _ in range(3))
        scores = torch.rand(b, h, n, n, device=DEV)
        block_map = torch.zeros(b, h, n, n, dtype=torch.bool, device=DEV)
        block_map.scatter_(-1, scores.topk(max(1, n // 8), dim=-1).indices, True)
        idx, num = map_to_index(block_map)
        full = torch.full((n,), block, dtype=torch.int32, device=DEV)
        part = full.clone()
        part[::7] = block // 2
        dout = torch.randn_like(q)
        flops = 4 * b * h * s * s * d / 8

        def fwd(sizes, all_full, need_backward):
            return C.cudnn_block_sparse_fwd(q, k, v, idx, num, sizes, block_size=block, bshd=True,
                                            softmax_scale=None, all_full=all_full, need_backward=need_backward)

        t_full = do_bench(lambda: fwd(full, True, False))
        t_part = do_bench(lambda: fwd(part, False, False))
        t_part_train = do_bench(lambda: fwd(part, False, True))
        t_san_v = do_bench(lambda: sanitize_kv_padding(None, v, part, block, bshd=True))
        t_san_kv = do_bench(lambda: sanitize_kv_padding(k, v, part, block, bshd=True))
        out, lse, saved = fwd(part, False, True)
        out_f, lse_f, saved_f = fwd(full, True, True)
        t_bwd_full = do_bench(lambda: C.cudnn_block_sparse_bwd(dout, q, k, v, out_f, lse_f, idx, num, full,
                                                               block_size=block, bshd=True, softmax_scale=None,
                                                               all_full=True, saved=saved_f))
        t_bwd_part = do_bench(lambda: C.cudnn_block_sparse_bwd(dout, q, k, v, out, lse, idx, num, part,
                                                               block_size=block, bshd=True, softmax_scale=None,
                                                               all_full=False, saved=saved))
        bytes_v = 2 * v.numel() * v.element_size()
        print(f"S={s} block={block}: fwd all-full {t_full:.3f} ms ({flops / t_full / 1e9:.0f} TF/s) | fwd partial "
              f"(V sanitized) {t_part:.3f} ms | fwd partial training (K+V sanitized) {t_part_train:.3f} ms | "
              f"sanitize V {t_san_v:.3f} ms ({bytes_v / t_san_v / 1e9:.0f} GB/s) K+V {t_san_kv:.3f} ms | "
              f"bwd all-full {t_bwd_full:.3f} ms ({2.5 * flops / t_bwd_full / 1e9:.0f} TF/s) | bwd partial "
              f"(saved reused) {t_bwd_part:.3f} ms", flush=True)


if __name__ == "__main__" and "--bench" in sys.argv:
    _bench()
