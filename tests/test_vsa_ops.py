"""VSA glue custom ops (``fastvideo_cute/vsa_ops.py``): both paths against the fp32 references,
gradients (``gradcheck`` in fp64 through the torch path), the composition with the sparse
branch against ``video_sparse_attn_reference`` and today's ``video_sparse_attn``, torch.compile
tracing, what autograd keeps, determinism and bad inputs. GPU tests (bf16, a Wan-1.3B-sized
case) at the end, marked ``gpu``.

On CPU the Triton path runs under TRITON_INTERPRET=1 (tests/conftest.py) for fp16/fp32; the
torch path runs for fp64 and bf16 CPU tensors, and wherever a test monkeypatches
``vsa_ops._use_triton``. Shapes are small (16-token blocks where the sparse branch is not
involved; the sparse branch needs 64).

Tolerances (CPU): fp32 glue ops measured <= 7e-7 max abs error against the references (see the
kernel tests); 1e-5 bound. The composed VSA in fp32 includes the sparse branch (measured ~1e-6
on CPU, test_api's 1e-4 bound; tf32 dots on a GPU: test_api's 2e-2).
"""

from __future__ import annotations

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import vsa_ops
from fastvideo_cute.metadata import index_to_map
from fastvideo_cute.ops import block_sparse_attn_op
from fastvideo_cute.reference import (block_mean_reference, block_sparse_attn_reference, coarse_attention_reference,
                                      gate_compose_reference, topk_indices_reference, video_sparse_attn_reference)
from fastvideo_cute.vsa_ops import vsa_compress, vsa_compress_backward_, vsa_gate, vsa_select

from .conftest import HAS_CUDA

DEV = "cuda" if HAS_CUDA else "cpu"
TOL = dict(atol=1e-5, rtol=1e-5)
E2E_TOL = 1e-4 if not HAS_CUDA else 2e-2


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(params=["triton", "torch"])
def path(request, monkeypatch):
    """Run a test on the fused kernels and again on the torch path."""
    if request.param == "torch":
        monkeypatch.setattr(vsa_ops, "_use_triton", lambda x: False)
    else:
        pytest.importorskip("triton")
    return request.param


def _bhsd(x, bshd):
    return x.transpose(1, 2) if bshd else x


def _sizes(*vals, device=DEV):
    return torch.tensor(vals, dtype=torch.int32, device=device)


def _qkv(b, h, sq, skv, d, dtype, bshd, seed=0, device=DEV):
    g = torch.Generator().manual_seed(seed)
    mk = lambda s: torch.randn((b, s, h, d) if bshd else (b, h, s, d), generator=g).to(device, dtype)  # noqa: E731
    return mk(sq), mk(skv), mk(skv)


def _poison_padding(x, sizes, block, bshd, value=float("nan")):
    xb = _bhsd(x, bshd)
    with torch.no_grad():
        for n, s in enumerate(sizes.tolist()):
            xb[:, :, n * block + s:(n + 1) * block] = value


# ---------------------------------------------------------------- the ops against the references

@pytest.mark.parametrize("bshd", [False, True])
def test_compress_matches_reference(path, bshd):
    qs, ks = _sizes(16, 7, 0), _sizes(0, 16, 3, 9)
    q, k, v = _qkv(2, 2, 48, 64, 32, torch.float32, bshd)
    for x, s in ((q, qs), (k, ks), (v, ks)):
        _poison_padding(x, s, 16, bshd)
    for t in (q, k, v):
        t.requires_grad_(True)
    qc, kc, vc = vsa_compress(q, k, v, qs, ks, 16, bshd)
    refs = [block_mean_reference(_bhsd(x, bshd), s, 16) for x, s in ((q, qs), (k, ks), (v, ks))]
    for got, want in zip((qc, kc, vc), refs):
        assert got.dtype == torch.float32 and got.is_contiguous()
        torch.testing.assert_close(got, want, **TOL)
    g = [torch.randn_like(r) for r in refs]
    got = torch.autograd.grad((qc, kc, vc), (q, k, v), g)
    want = torch.autograd.grad(refs, (q, k, v), g)
    for a, w in zip(got, want):
        assert a.shape == w.shape and a.is_contiguous()
        assert torch.equal(a, w)  # a correctly rounded division per element, exact in fp32


def test_compress_bf16_cpu_takes_the_torch_path():
    qs, ks = _sizes(16, 5, device="cpu"), _sizes(3, 16, device="cpu")
    q, k, v = _qkv(1, 2, 32, 32, 16, torch.bfloat16, False, device="cpu")
    qc, kc, vc = vsa_compress(q, k, v, qs, ks, 16, False)
    torch.testing.assert_close(qc, block_mean_reference(q, qs, 16), **TOL)
    torch.testing.assert_close(vc, block_mean_reference(v, ks, 16), **TOL)


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_select_matches_reference(path, out_dtype):
    g = torch.Generator().manual_seed(1)
    qc, kc, vc = (torch.randn(2, 2, n, 32, generator=g).to(DEV) for n in (5, 9, 9))
    sizes = _sizes(16, 0, 4, 16, 0, 16, 1, 16, 16)
    leaves = [x.clone().requires_grad_(True) for x in (qc, kc, vc)]
    out, idx, num = vsa_select(*leaves, sizes, 3, 32 ** -0.5, out_dtype)
    ref_out, _, ref_scores = coarse_attention_reference(qc, kc, vc, sizes)
    assert out.dtype == out_dtype and idx.dtype == torch.int32 and num.dtype == torch.int32
    assert idx.shape == (2, 2, 5, 3) and torch.equal(num, torch.full_like(num, 3))
    tol = TOL if out_dtype == torch.float32 else dict(atol=1e-3, rtol=1e-3)  # one fp16 rounding
    torch.testing.assert_close(out.float(), ref_out, **tol)
    assert torch.equal(idx.long(), topk_indices_reference(ref_scores, 3))  # random scores: no near-ties here
    dout = torch.randn(out.shape, generator=g).to(DEV, out_dtype)
    got = torch.autograd.grad(out, leaves, dout)
    ref_leaves = [x.clone().requires_grad_(True) for x in (qc, kc, vc)]
    want = torch.autograd.grad(coarse_attention_reference(*ref_leaves, sizes)[0], ref_leaves, dout.float())
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, **TOL)


def test_select_equals_topk_block_map_on_exact_scores(path):
    """Integer means, D=16 (scale 1/4): every path's scores are exact, with many ties; the index
    lists are exactly topk_block_map's map as index lists (ascending)."""
    g = torch.Generator().manual_seed(2)
    qc, kc = (torch.randint(-2, 3, (1, 2, n, 16), generator=g).float().to(DEV) for n in (7, 21))
    vc = torch.randn(1, 2, 21, 16, generator=g).to(DEV)
    sizes = _sizes(*([3] * 10 + [0] + [3] * 10))
    for topk in (1, 4, 21, 30):
        _, idx, num = vsa_select(qc, kc, vc, sizes, topk, 0.25, torch.float32)
        scores = (qc @ kc.transpose(-2, -1) * 0.25).masked_fill(sizes == 0, float("-inf"))
        want_map = fvc.topk_block_map(scores, topk)
        assert torch.equal(index_to_map(idx, num, 21), want_map)
        assert torch.equal(idx, fvc.map_to_index(want_map)[0][..., :min(topk, 21)])


@pytest.mark.parametrize("bshd", [False, True])
@pytest.mark.parametrize("with_gate", [True, False])
def test_gate_matches_reference(path, bshd, with_gate):
    g = torch.Generator().manual_seed(3)
    shape = (2, 48, 2, 32) if bshd else (2, 2, 48, 32)
    out_s, gate = (torch.randn(shape, generator=g).to(DEV).requires_grad_(True) for _ in range(2))
    out_c = torch.randn(2, 2, 3, 32, generator=g).to(DEV).requires_grad_(True)
    gate_in = gate if with_gate else None
    out = vsa_gate(out_s, out_c, gate_in, 16, bshd)
    ref = gate_compose_reference(_bhsd(out_s, bshd), out_c, _bhsd(gate, bshd) if with_gate else None, 16)
    assert out.shape == out_s.shape and out.is_contiguous()
    torch.testing.assert_close(_bhsd(out, bshd), ref, **TOL)
    dout = torch.randn(out.shape, generator=g).to(DEV)
    inputs = (out_s, out_c) + ((gate,) if with_gate else ())
    got = torch.autograd.grad(out, inputs, dout)
    want = torch.autograd.grad(ref, inputs, _bhsd(dout, bshd))
    assert got[0] is dout or torch.equal(got[0], dout)  # d out_s is dout, passed through
    for a, w in zip(got, want):
        torch.testing.assert_close(a, w, **TOL)


def test_triton_and_torch_paths_agree(monkeypatch):
    pytest.importorskip("triton")
    qs, ks = _sizes(16, 7, 0), _sizes(0, 16, 3, 9, 16)

    def chain():
        q, k, v = _qkv(1, 2, 48, 80, 32, torch.float32, True, seed=4)
        qc, kc, vc = vsa_compress(q, k, v, qs, ks, 16, True)
        out_c, idx, num = vsa_select(qc, kc, vc, ks, 2, 32 ** -0.5, torch.float32)
        return qc, kc, vc, out_c, idx, num

    fused = chain()
    monkeypatch.setattr(vsa_ops, "_use_triton", lambda x: False)
    plain = chain()
    for a, b in zip(fused, plain):
        if a.dtype == torch.int32:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a, b, **TOL)


# ---------------------------------------------------------------- gradcheck (fp64: the torch path)

def test_gradcheck_compress():
    qs, ks = _sizes(16, 5), _sizes(0, 9)
    q, k, v = (x.requires_grad_(True) for x in _qkv(1, 1, 32, 32, 8, torch.float64, True, seed=5))
    assert torch.autograd.gradcheck(lambda q, k, v: vsa_compress(q, k, v, qs, ks, 16, True), (q, k, v))


def test_gradcheck_select():
    g = torch.Generator().manual_seed(6)
    qc, kc, vc = (torch.randn(1, 1, n, 8, generator=g, dtype=torch.float64).to(DEV).requires_grad_(True)
                  for n in (3, 5, 5))
    sizes = _sizes(4, 0, 4, 1, 4)
    fn = lambda qc, kc, vc: vsa_select(qc, kc, vc, sizes, 2, 8 ** -0.5, torch.float64)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (qc, kc, vc))
    # every kv block empty: out_c is 0 and so are its gradients
    empty = _sizes(0, 0, 0, 0, 0)
    fn0 = lambda qc, kc, vc: vsa_select(qc, kc, vc, empty, 2, 8 ** -0.5, torch.float64)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn0, (qc, kc, vc))
    assert (fn0(qc, kc, vc) == 0).all()


@pytest.mark.parametrize("with_gate", [True, False])
def test_gradcheck_gate(with_gate):
    g = torch.Generator().manual_seed(7)
    out_s, gate = (torch.randn(1, 2, 32, 8, generator=g, dtype=torch.float64).to(DEV).requires_grad_(True)
                   for _ in range(2))
    out_c = torch.randn(1, 2, 2, 8, generator=g, dtype=torch.float64).to(DEV).requires_grad_(True)
    if with_gate:
        assert torch.autograd.gradcheck(lambda a, b, c: vsa_gate(a, b, c, 16, False), (out_s, out_c, gate))
    else:
        assert torch.autograd.gradcheck(lambda a, b: vsa_gate(a, b, None, 16, False), (out_s, out_c))


# ---------------------------------------------------------------- the composition

def _glue_vsa(q, k, v, kv_sizes, q_sizes, topk, block, gate, bshd):
    """video_sparse_attn composed from the glue ops and the existing sparse op."""
    d = q.shape[-1]
    qc, kc, vc = vsa_compress(q, k, v, q_sizes, kv_sizes, block, bshd)
    out_c, idx, num = vsa_select(qc, kc, vc, kv_sizes, topk, d ** -0.5, q.dtype)
    block_map = index_to_map(idx, num, kc.shape[2])
    out_s, _ = block_sparse_attn_op(q, k, v, block_map, kv_sizes, block_size=block, bshd=bshd, sm_scale=d ** -0.5,
                                    need_lse=False)
    return vsa_gate(out_s, out_c, gate, block, bshd), block_map


@pytest.mark.parametrize("bshd,with_gate", [(False, True), (True, False)])
def test_composition_matches_reference_and_todays_vsa(bshd, with_gate):
    pytest.importorskip("triton")
    be, topk = 64, 2
    q, k, v = _qkv(1, 2, 3 * be, 3 * be, 32, torch.float32, bshd, seed=8)
    kv_sizes, q_sizes = _sizes(64, 40, 64), _sizes(64, 64, 23)
    for x, s in ((q, q_sizes), (k, kv_sizes), (v, kv_sizes)):
        _poison_padding(x, s, be, bshd, value=0.0)  # zero padding, as to_tiles writes
    w = torch.randn_like(q) * 0.5 if with_gate else None
    inputs = (q, k, v) + ((w,) if with_gate else ())
    for t in inputs:
        t.requires_grad_(True)
    out, block_map = _glue_vsa(q, k, v, kv_sizes, q_sizes, topk, be, w, bshd)
    ref = video_sparse_attn_reference(*(_bhsd(t, bshd) for t in (q, k, v)), kv_sizes, q_sizes, topk, be,
                                      None if w is None else _bhsd(w, bshd))
    today = (fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn)(q, k, v, kv_sizes, q_sizes, topk, be, w)
    torch.testing.assert_close(_bhsd(out, bshd), ref, atol=E2E_TOL, rtol=E2E_TOL)
    torch.testing.assert_close(out, today, atol=E2E_TOL, rtol=E2E_TOL)
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, dout)
    want = torch.autograd.grad(ref, inputs, _bhsd(dout, bshd))
    for a, r in zip(got, want):
        torch.testing.assert_close(a, r, atol=10 * E2E_TOL, rtol=10 * E2E_TOL)


def test_compress_backward_accumulate_in_place(path):
    """dq/dk/dv += the mean's gradient at valid tokens; padding keeps its bits (NaN, -0.0)."""
    qs, ks = _sizes(16, 7, 0), _sizes(5, 16)
    g = torch.Generator().manual_seed(9)
    dqc, dkc, dvc = (torch.randn(2, 2, n, 32, generator=g).to(DEV) for n in (3, 2, 2))
    base = list(_qkv(2, 2, 48, 32, 32, torch.float32, True, seed=10))
    for x, s, val in zip(base, (qs, ks, ks), (float("nan"), -0.0, float("nan"))):
        _poison_padding(x, s, 16, True, value=val)
    acc = [x.clone() for x in base]
    vsa_compress_backward_(dqc, dkc, dvc, qs, ks, *acc, 16, True)
    leaves = [torch.zeros_like(x).requires_grad_(True) for x in base]
    means = vsa_compress(*leaves, qs, ks, 16, True)
    fresh = torch.autograd.grad(means, leaves, (dqc, dkc, dvc))
    for a, b0, f, s in zip(acc, base, fresh, (qs, ks, ks)):
        valid = (torch.arange(a.shape[1], device=DEV) % 16 < s.repeat_interleave(16)).view(1, -1, 1, 1).expand_as(a)
        torch.testing.assert_close(a[valid], (b0 + f)[valid], **TOL)
        assert torch.equal(a[~valid].view(torch.int32), b0[~valid].view(torch.int32))
    # a pair may be skipped
    only_dv = base[2].clone()
    vsa_compress_backward_(None, None, dvc, qs, ks, None, None, only_dv, 16, True)
    assert torch.equal(only_dv.view(torch.int32), acc[2].view(torch.int32))


# ---------------------------------------------------------------- autograd memory, compile, determinism

def test_select_keeps_no_score_sized_tensor_for_backward():
    """What autograd saves for vsa_select: qc, kc, vc, the sizes, an fp32 out_c and the LSE;
    nothing of [B, H, Qb, KVb] (Qb = 24, KVb = 40)."""
    g = torch.Generator().manual_seed(11)
    qc, kc, vc = (torch.randn(1, 1, n, 16, generator=g).to(DEV).requires_grad_(True) for n in (24, 40, 40))
    sizes = _sizes(*([4] * 40))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        vsa_select(qc, kc, vc, sizes, 3, 0.25, torch.float16)
    assert saved, "nothing recorded: the hook did not see the op's saved tensors"
    assert not any(len(s) >= 2 and s[-2:] == (24, 40) for s in saved), saved
    expected = [(1, 1, 24, 16), (1, 1, 40, 16), (1, 1, 40, 16), (40,), (1, 1, 24, 16), (1, 1, 24)]
    assert sorted(saved) == sorted(expected), saved


def test_torch_compile_fullgraph_traces_the_ops():
    torch._dynamo.reset()
    qs, ks = _sizes(16, 7), _sizes(0, 16, 3)
    q, k, v = _qkv(1, 2, 32, 48, 32, torch.float32, True, seed=12)
    gate = torch.randn_like(q)

    def fn(q, k, v, gate):
        qc, kc, vc = vsa_compress(q, k, v, qs, ks, 16, True)
        out_c, idx, num = vsa_select(qc, kc, vc, ks, 2, 32 ** -0.5, q.dtype)
        return vsa_gate(q * 2, out_c, gate, 16, True), idx, num

    results = []
    for f in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, gate)]
        out, idx, num = f(*leaves)
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
        results.append((out, idx, num) + grads)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_torch_compile_traces_the_accumulating_backward():
    torch._dynamo.reset()
    qs, ks = _sizes(16, 7), _sizes(0, 16, 3)
    dqc, dkc = torch.randn(1, 2, 2, 32, device=DEV), torch.randn(1, 2, 3, 32, device=DEV)

    def fn(dq, dk):
        vsa_compress_backward_(dqc, dkc, None, qs, ks, dq, dk, None, 16, False)
        return dq, dk

    base = [torch.randn(1, 2, 32, 32, device=DEV), torch.randn(1, 2, 48, 32, device=DEV)]
    eager = fn(*[x.clone() for x in base])
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(*[x.clone() for x in base])
    for a, b, x in zip(eager, compiled, base):
        assert not torch.equal(a, x)  # it did add something
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_fused_chain_is_deterministic():
    pytest.importorskip("triton")
    qs, ks = _sizes(16, 7, 0), _sizes(0, 16, 3, 9)

    def run():
        leaves = [x.requires_grad_(True) for x in _qkv(2, 2, 48, 64, 32, torch.float32, False, seed=13)]
        gate = torch.randn(leaves[0].shape, generator=torch.Generator().manual_seed(14)).to(DEV).requires_grad_(True)
        qc, kc, vc = vsa_compress(*leaves, qs, ks, 16, False)
        out_c, idx, num = vsa_select(qc, kc, vc, ks, 2, 32 ** -0.5, torch.float32)
        out = vsa_gate(leaves[0] * 1, out_c, gate, 16, False)
        return (out, idx, num) + torch.autograd.grad(out, leaves + [gate], torch.ones_like(out))

    a, b = run(), run()
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_vsa_ops_import_is_light_and_glue_kernels_import_no_torch():
    """Importing vsa_ops loads no kernel module (they load on first use), and the glue kernel
    modules do not import torch (the project's layering rule), checked on their source."""
    import ast
    import json
    import pathlib
    import subprocess
    import sys

    code = "import json, sys, fastvideo_cute.vsa_ops; print(json.dumps(sorted(sys.modules)))"
    mods = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                     timeout=120).stdout.strip().splitlines()[-1])
    assert not [m for m in mods if m.startswith("fastvideo_cute.kernels")]
    kernel_dir = pathlib.Path(vsa_ops.__file__).parent / "kernels" / "triton"
    files = sorted(kernel_dir.glob("vsa_*.py"))
    assert len(files) >= 4
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "torch" or n.startswith("torch.") for n in names), f"{f.name} imports torch"


# ---------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("case,exc,match", [
    ("q_3d", ValueError, "q must be 4-D"),
    ("int_q", TypeError, "q must have a dtype"),
    ("k_dtype", TypeError, "k must have q's dtype"),
    ("block", ValueError, "block must be a power-of-two"),
    ("seq", ValueError, "sequence length 40 must be a positive multiple of block 16"),
    ("sizes_dtype", TypeError, "q_sizes must be int32"),
    ("sizes_len", ValueError, "kv_sizes must be a contiguous 1-D tensor of 2 entries"),
    ("heads", ValueError, "q and k must share batch, heads and head_dim"),
])
def test_compress_bad_inputs(case, exc, match):
    q, k, v = _qkv(1, 2, 32, 32, 16, torch.float32, False)
    qs, ks, block = _sizes(16, 16), _sizes(16, 16), 16
    if case == "q_3d":
        q = q[0]
    elif case == "int_q":
        q = q.to(torch.int32)
    elif case == "k_dtype":
        k = k.half()
    elif case == "block":
        block = 24
    elif case == "seq":
        q = torch.randn(1, 2, 40, 16, device=DEV)
    elif case == "sizes_dtype":
        qs = qs.long()
    elif case == "sizes_len":
        ks = _sizes(16, 16, 16)
    elif case == "heads":
        k, v = k[:, :1], v[:, :1]
    with pytest.raises(exc, match=match):
        vsa_compress(q, k, v, qs, ks, block, False)


@pytest.mark.parametrize("case,exc,match", [
    ("qc_half", TypeError, "qc must have a dtype"),
    ("topk", ValueError, "topk must be a positive int"),
    ("scale", ValueError, "sm_scale must be a positive finite float"),
    ("out_dtype", TypeError, "out_dtype must be one of"),
    ("shapes", ValueError, "must agree"),
    ("sizes", ValueError, "kv_sizes must be a contiguous 1-D tensor of 4 entries"),
])
def test_select_bad_inputs(case, exc, match):
    qc, kc, vc = torch.randn(1, 1, 3, 16, device=DEV), torch.randn(1, 1, 4, 16, device=DEV), torch.randn(1, 1, 4, 16,
                                                                                                        device=DEV)
    sizes, topk, scale, out_dtype = _sizes(1, 1, 1, 1), 2, 0.25, torch.float32
    if case == "qc_half":
        qc = qc.half()
    elif case == "topk":
        topk = 0
    elif case == "scale":
        scale = float("inf")
    elif case == "out_dtype":
        out_dtype = torch.int32
    elif case == "shapes":
        vc = vc[..., :8]
    elif case == "sizes":
        sizes = _sizes(1, 1, 1)
    with pytest.raises(exc, match=match):
        vsa_select(qc, kc, vc, sizes, topk, scale, out_dtype)


@pytest.mark.parametrize("case,exc,match", [
    ("oc_shape", ValueError, "out_c must have shape"),
    ("gate_dtype", TypeError, "gate must have out_s's dtype"),
    ("gate_shape", ValueError, "gate must be 4-D"),
])
def test_gate_bad_inputs(case, exc, match):
    out_s, gate, out_c = torch.randn(1, 2, 32, 16, device=DEV), torch.randn(1, 2, 32, 16, device=DEV), \
        torch.randn(1, 2, 2, 16, device=DEV)
    if case == "oc_shape":
        out_c = out_c[:, :, :1]
    elif case == "gate_dtype":
        gate = gate.half()
    elif case == "gate_shape":
        gate = gate[0]
    with pytest.raises(exc, match=match):
        vsa_gate(out_s, out_c, gate, 16, False)


# ---------------------------------------------------------------- GPU (bf16), run on the H200

def _nerr(got, ref):
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-6)).item()


def _assert_near_ties_only(idx, scores, topk, rel=1e-5):
    """``idx`` (ours) vs the stable sort of ``scores`` (torch's, cuBLAS fp32): rows may differ only
    in blocks whose score is within ``rel`` (of the row's largest magnitude) of the row's k-th
    score, where a different fp32 summation order can swap them."""
    k = min(topk, scores.shape[-1])
    want = fvc.topk_block_map(scores, k)
    ours = index_to_map(idx, torch.full(idx.shape[:-1], k, dtype=torch.int32, device=idx.device), scores.shape[-1])
    diff = ours ^ want
    if not diff.any():
        return 0
    kth = scores.sort(dim=-1, descending=True).values[..., k - 1:k]
    scale = scores.abs().masked_fill(torch.isinf(scores), 0).amax(-1, keepdim=True).clamp(min=1e-6)
    assert ((scores - kth).abs()[diff] <= rel * scale.expand_as(scores)[diff]).all(), "a non-tie selection differs"
    return int(diff.any(-1).sum())


WAN_GRID, WAN_TILE = (21, 30, 52), (4, 4, 4)  # Wan2.1-1.3B 480p latent, 64-token tiles: 624 blocks


@pytest.mark.gpu
def test_gpu_glue_ops_bf16_wan_1_3b():
    """Each fused op at Wan2.1-1.3B 480p size (H=12, D=128, S=39936 tiled, 624 blocks, 78 selected)
    against the fp32 references. Bounds (normalised max error): means 1e-5 (fp32 sums of bf16
    values); out_c 1e-2 (one bf16 rounding, 2^-8 = 3.9e-3); coarse gradients 1e-4 (fp32 ieee);
    gate 1e-2 (one bf16 rounding)."""
    torch.manual_seed(0)
    sizes = fvc.variable_block_sizes(WAN_GRID, WAN_TILE, device="cuda").to(torch.int32)
    n, be, h, d = sizes.numel(), 64, 12, 128
    x = [fvc.to_tiles(torch.randn(1, 21 * 30 * 52, h, d, device="cuda", dtype=torch.bfloat16), WAN_GRID, WAN_TILE,
                      dim=1) for _ in range(3)]
    q, k, v = (t.requires_grad_(True) for t in x)
    qc, kc, vc = vsa_compress(q, k, v, sizes, sizes, be, True)
    for got, t in zip((qc, kc, vc), (q, k, v)):
        assert _nerr(got, block_mean_reference(t.transpose(1, 2), sizes, be)) < 1e-5
    topk = n // 8
    leaves = [t.detach().clone().requires_grad_(True) for t in (qc, kc, vc)]
    out_c, idx, num = vsa_select(*leaves, sizes, topk, d ** -0.5, torch.bfloat16)
    ref_leaves = [t.detach().clone().requires_grad_(True) for t in (qc, kc, vc)]
    ref_out, _, ref_scores = coarse_attention_reference(*ref_leaves, sizes)
    assert _nerr(out_c, ref_out) < 1e-2
    flips = _assert_near_ties_only(idx, ref_scores.detach(), topk)
    print(f"rows whose selection differs from the cuBLAS-scores sort (near-ties only): {flips} / {idx[..., 0].numel()}")
    dout = torch.randn_like(out_c)
    got = torch.autograd.grad(out_c, leaves, dout)
    want = torch.autograd.grad(ref_out, ref_leaves, dout.float())
    for a, w in zip(got, want):
        assert _nerr(a, w) < 1e-4
    out_s = torch.randn_like(q)
    gate = torch.randn_like(q).requires_grad_(True)
    oc = out_c.detach().requires_grad_(True)
    out = vsa_gate(out_s, oc, gate, be, True)
    ref = gate_compose_reference(out_s.transpose(1, 2), oc, gate.transpose(1, 2), be)
    assert _nerr(out.transpose(1, 2), ref) < 1e-2
    g_out = torch.randn_like(out)
    got = torch.autograd.grad(out, (oc, gate), g_out)
    want = torch.autograd.grad(ref, (oc, gate), g_out.transpose(1, 2).float())
    assert _nerr(got[0], want[0]) < 1e-2 and _nerr(got[1], want[1]) < 1e-2  # grads in the inputs' layouts


@pytest.mark.gpu
@pytest.mark.parametrize("bshd,with_gate", [(False, True), (True, False), (True, True)])
def test_gpu_composition_bf16(bshd, with_gate):
    """compress -> select -> sparse (Triton route) -> gate at S=4096 (64 blocks, ragged, empty kv
    blocks) in bf16 against the fp32 reference given the same selection (the selection itself is
    checked against the reference's scores up to near-ties). Bounds as test_gpu_triton's: 1e-2
    forward, 2e-2 gradients (normalised)."""
    torch.manual_seed(1)
    be, nb, h, d, topk = 64, 64, 4, 128, 8
    gen = torch.Generator().manual_seed(2)
    sizes = torch.randint(1, be + 1, (nb,), generator=gen, dtype=torch.int32)
    sizes[::7] = 0
    sizes = sizes.cuda()
    q, k, v = _qkv(2, h, nb * be, nb * be, d, torch.bfloat16, bshd, seed=3, device="cuda")
    w = torch.randn_like(q) if with_gate else None
    inputs = (q, k, v) + ((w,) if with_gate else ())
    for t in inputs:
        t.requires_grad_(True)
    out, block_map = _glue_vsa(q, k, v, sizes, sizes, topk, be, w, bshd)
    qb, kb, vb = (_bhsd(t, bshd) for t in (q, k, v))
    qc, kc, vc = (block_mean_reference(t, sizes, be) for t in (qb, kb, vb))
    ref_c, _, ref_scores = coarse_attention_reference(qc, kc, vc, sizes)
    _assert_near_ties_only(fvc.map_to_index(block_map)[0][..., :topk], ref_scores.detach(), topk)
    ref_s, _ = block_sparse_attn_reference(qb, kb, vb, block_map, sizes, be)
    ref = gate_compose_reference(ref_s, ref_c, None if w is None else _bhsd(w, bshd), be)
    assert _nerr(_bhsd(out, bshd), ref) < 1e-2
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, dout)
    want = torch.autograd.grad(ref, inputs, _bhsd(dout, bshd).float())
    for a, r in zip(got, want):
        assert _nerr(a, r) < 2e-2


@pytest.mark.gpu
def test_gpu_glue_deterministic_wan_1_3b():
    """Two runs of the glue chain (fwd + bwd) at Wan2.1-1.3B size are bitwise equal."""
    sizes = fvc.variable_block_sizes(WAN_GRID, WAN_TILE, device="cuda").to(torch.int32)
    be, h, d = 64, 12, 128

    def run():
        g = torch.Generator(device="cuda").manual_seed(4)
        s = sizes.numel() * be
        q, k, v, gate, out_s = (torch.randn(1, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
                                .requires_grad_(True) for _ in range(5))
        qc, kc, vc = vsa_compress(q, k, v, sizes, sizes, be, True)
        out_c, idx, num = vsa_select(qc, kc, vc, sizes, sizes.numel() // 8, d ** -0.5, q.dtype)
        out = vsa_gate(out_s, out_c, gate, be, True)
        grads = torch.autograd.grad(out, (q, k, v, gate, out_s), torch.ones_like(out))
        return (out, idx, num) + grads

    a, b = run(), run()
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("bshd", [False, True])
@pytest.mark.parametrize("clean_k", [False, True])
def test_compress_clean_writes_padding_zeroed_copies(path, bshd, clean_k):
    """``_compress_clean``: the block means of ``_compress`` (same bits on one path) plus V (and K)
    with every padding row 0 and the valid rows as they are, contiguous in the call layout; the
    torch and Triton paths give the same copies."""
    qs, ks = _sizes(16, 7, 0), _sizes(0, 16, 3, 9)
    q, k, v = _qkv(2, 2, 48, 64, 32, torch.float32, bshd, seed=5)
    for x, s in ((q, qs), (k, ks), (v, ks)):
        _poison_padding(x, s, 16, bshd)
    qc, kc, vc, k_clean, v_clean = vsa_ops._compress_clean(q, k, v, qs, ks, 16, bshd, True, clean_k)
    for got, want in zip((qc, kc, vc), vsa_ops._compress(q, k, v, qs, ks, 16, bshd, True)):
        assert torch.equal(got, want)
    assert (k_clean.numel() == k.numel()) == clean_k
    for x, c in ((v, v_clean),) + (((k, k_clean),) if clean_k else ()):
        assert c.is_contiguous() and c.shape == x.shape
        xb, cb = _bhsd(x, bshd), _bhsd(c, bshd)
        for n, s in enumerate(ks.tolist()):
            assert torch.equal(cb[:, :, n * 16:n * 16 + s], xb[:, :, n * 16:n * 16 + s])
            assert not cb[:, :, n * 16 + s:(n + 1) * 16].any()
