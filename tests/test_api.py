"""Public API on the Triton route (the interpreter on CPU): parity with the fp32 reference,
layouts, VSA composition, routing/env vars, torch.compile tracing and bad inputs.

Tolerances: fp32 inputs run the kernels in fp32 (tl.dot may use tf32 on GPU, not in the
interpreter); measured max abs error on these shapes is ~1e-6 on CPU, so 1e-4 is headroom.
fp16 inputs: measured ~1e-3 (rounding of P to fp16 before the PV product); 1e-2 bound.
"""

import logging

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute.reference import block_sparse_attn_reference, video_sparse_attn_reference
from fastvideo_cute.routes import RouteError

from .conftest import HAS_CUDA, spy_backend_calls

DEV = "cuda" if HAS_CUDA else "cpu"
FP32_TOL = 1e-4 if not HAS_CUDA else 2e-2  # tf32 dots on GPU


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)


def _inputs(b, h, sq, skv, d, dtype=torch.float32, bshd=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape_q = (b, sq, h, d) if bshd else (b, h, sq, d)
    shape_k = (b, skv, h, d) if bshd else (b, h, skv, d)
    q = torch.randn(shape_q, generator=g).to(DEV, dtype)
    k = torch.randn(shape_k, generator=g).to(DEV, dtype)
    v = torch.randn(shape_k, generator=g).to(DEV, dtype)
    return q, k, v


def _to_bhsd(x, bshd):
    return x.transpose(1, 2) if bshd else x


API = {64: (fvc.block_sparse_attn, fvc.block_sparse_attn_bshd),
       128: (fvc.block_sparse_attn_128, fvc.block_sparse_attn_128_bshd),
       256: (fvc.block_sparse_attn_256, fvc.block_sparse_attn_256_bshd)}


@pytest.mark.parametrize("block,bshd", [(64, False), (64, True), (128, True), (256, False)])
def test_block_sparse_fwd_bwd_matches_reference(block, bshd):
    qb, kvb = 2, 3
    q, k, v = _inputs(1, 2, qb * block, kvb * block, 32, bshd=bshd, seed=block)
    sizes = torch.tensor([block, block // 2 + 3, 0], dtype=torch.int32, device=DEV)
    # padding keys hold garbage that must not leak
    kb, vb = _to_bhsd(k, bshd), _to_bhsd(v, bshd)
    kb[:, :, block + block // 2 + 3:2 * block] = float("nan")
    vb[:, :, 2 * block:] = float("inf")
    block_map = torch.tensor([[True, True, True], [False, False, False]], device=DEV).expand(2, 2, 3).clone()
    block_map[1, 0, 1] = True
    for t in (q, k, v):
        t.requires_grad_(True)
    fn = API[block][1 if bshd else 0]
    out, lse = fn(q, k, v, block_map, sizes)
    assert out.shape == q.shape and lse.shape == (1, 2, qb * block) and lse.dtype == torch.float32
    assert not lse.requires_grad
    ref, ref_lse = block_sparse_attn_reference(_to_bhsd(q, bshd), kb, vb, block_map, sizes, block)
    torch.testing.assert_close(_to_bhsd(out, bshd), ref, atol=FP32_TOL, rtol=FP32_TOL)
    finite = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=FP32_TOL, rtol=FP32_TOL)
    assert torch.equal(torch.isneginf(lse), ~finite)
    # head 0 query block 1 selects nothing: exact zeros
    assert (_to_bhsd(out, bshd)[0, 0, block:] == 0).all()
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), _to_bhsd(grad, bshd))
    for name, g, w in zip("qkv", got, want):
        w = torch.nan_to_num(w, nan=0.0, posinf=0.0, neginf=0.0)  # the reference zeroes padding K/V itself
        torch.testing.assert_close(g, w, atol=10 * FP32_TOL, rtol=10 * FP32_TOL, msg=f"d{name}")
    dk, dv = _to_bhsd(got[1], bshd), _to_bhsd(got[2], bshd)
    assert (dk[:, :, block + block // 2 + 3:] == 0).all() and (dv[:, :, 2 * block:] == 0).all()


def test_three_dim_map_and_q_len_ne_kv_len_fp16():
    q, k, v = _inputs(2, 1, 64, 192, 32, dtype=torch.float16)
    sizes = torch.tensor([64, 5, 64], dtype=torch.int32, device=DEV)
    block_map = torch.tensor([[[True, True, False]]], device=DEV)  # [H, Qb, KVb]
    out, lse = fvc.block_sparse_attn(q, k, v, block_map, sizes)
    ref, ref_lse = block_sparse_attn_reference(q, k, v, block_map, sizes, 64)
    torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse, ref_lse, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("bshd,gate", [(False, True), (True, False)])
def test_video_sparse_attn_matches_reference(bshd, gate):
    blocks, be, topk = 3, 64, 2
    q, k, v = _inputs(1, 2, blocks * be, blocks * be, 32, bshd=bshd, seed=7)
    kv_sizes = torch.tensor([64, 40, 64], dtype=torch.int32, device=DEV)
    q_sizes = torch.tensor([64, 64, 23], dtype=torch.int32, device=DEV)
    # padding slots are zero (as produced by to_tiles)
    for x, s in ((k, kv_sizes), (v, kv_sizes), (q, q_sizes)):
        xb = _to_bhsd(x, bshd)
        for j, n in enumerate(s.tolist()):
            xb[:, :, j * be + n:(j + 1) * be] = 0
    w = (torch.randn_like(q) * 0.5) if gate else None
    for t in (q, k, v) + ((w,) if gate else ()):
        t.requires_grad_(True)
    fn = fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn
    out = fn(q, k, v, kv_sizes, q_sizes, topk, block_size=(4, 4, 4), compress_attn_weight=w)
    ref = video_sparse_attn_reference(*(_to_bhsd(t, bshd) for t in (q, k, v)), kv_sizes, q_sizes, topk, (4, 4, 4),
                                      None if w is None else _to_bhsd(w, bshd))
    torch.testing.assert_close(_to_bhsd(out, bshd), ref, atol=FP32_TOL, rtol=FP32_TOL)
    inputs = (q, k, v) + ((w,) if gate else ())
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, inputs, grad)
    want = torch.autograd.grad(ref, inputs, _to_bhsd(grad, bshd))
    for g, r in zip(got, want):
        torch.testing.assert_close(g, r, atol=10 * FP32_TOL, rtol=10 * FP32_TOL)


def test_topk_block_map_exact_and_ties():
    s = torch.tensor([[[0.5, 2.0, 2.0, -1.0, 2.0]]])
    assert fvc.topk_block_map(s, 2).tolist() == [[[False, True, True, False, False]]]
    r = torch.randn(2, 3, 9, 17)
    from fastvideo_cute.reference import topk_block_map_reference
    assert torch.equal(fvc.topk_block_map(r, 5), topk_block_map_reference(r, 5))


# ---------------------------------------------------------------- routing / env vars

def _small():
    q, k, v = _inputs(1, 1, 64, 64, 32)
    return q, k, v, torch.ones(1, 1, 1, 1, dtype=torch.bool, device=DEV), torch.full((1,), 64, dtype=torch.int32,
                                                                                      device=DEV)


def test_forced_triton_runs(monkeypatch):
    from fastvideo_cute import ops

    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    q, k, v, m, s = _small()
    before = ops.dispatch_counts[("triton", "fwd")]
    out, lse = fvc.block_sparse_attn(q, k, v, m, s)
    assert ops.dispatch_counts[("triton", "fwd")] == before + 1  # observed, not recomputed
    ref, ref_lse = block_sparse_attn_reference(q, k, v, m, s, 64)
    torch.testing.assert_close(out.float(), ref, atol=FP32_TOL if q.dtype == torch.float32 else 1e-2, rtol=0)


def test_both_flags_is_an_error(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    with pytest.raises(RouteError, match="both set"):
        fvc.block_sparse_attn(*_small())


def test_unknown_backend_name(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "nope")
    with pytest.raises(RouteError, match="not a backend"):
        fvc.block_sparse_attn(*_small())


@pytest.mark.skipif(HAS_CUDA, reason="checks the CPU-without-interpreter refusal")
def test_triton_forced_without_interpreter_on_cpu_raises(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RouteError, match="TRITON_INTERPRET"):
        fvc.block_sparse_attn(*_small())


def test_cute_fallback_logs_reason_once(monkeypatch, caplog):
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    from fastvideo_cute import routes
    monkeypatch.setattr(routes, "_LOGGED", set())
    q, k, v, m, s = _small()
    q = q.float()  # fp32 is not a CuTe dtype on any backend, so the call must fall back
    with caplog.at_level(logging.WARNING, logger="fastvideo_cute"):
        fvc.block_sparse_attn(q, k, v, m, s)
        fvc.block_sparse_attn(q, k, v, m, s)
    msgs = [r.getMessage() for r in caplog.records if "CuTe route cannot serve" in r.getMessage()]
    assert len(msgs) == 1 and "using Triton" in msgs[0]


# ---------------------------------------------------------------- torch.compile

@pytest.mark.parametrize("which", ["bsa64", "bsa256_bshd", "vsa", "vsa_bshd"])
def test_torch_compile_fullgraph_traces(which):
    torch._dynamo.reset()
    q, k, v = _inputs(1, 1, 256, 256, 32, bshd=which.endswith("bshd"))
    sizes256 = torch.full((1,), 256, dtype=torch.int32, device=DEV)
    sizes64 = torch.full((4,), 64, dtype=torch.int32, device=DEV)
    if which == "bsa64":
        m = torch.rand(1, 1, 4, 4, device=DEV) > 0.5
        fn = lambda q, k, v: fvc.block_sparse_attn(q, k, v, m, sizes64)[0]  # noqa: E731
    elif which == "bsa256_bshd":
        m = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=DEV)
        fn = lambda q, k, v: fvc.block_sparse_attn_256_bshd(q, k, v, m, sizes256)[0]  # noqa: E731
    elif which == "vsa":
        fn = lambda q, k, v: fvc.video_sparse_attn(q, k, v, sizes64, sizes64, 2, (4, 4, 4))  # noqa: E731
    else:
        fn = lambda q, k, v: fvc.video_sparse_attn_bshd(q, k, v, sizes256, sizes256, 1, (4, 8, 8))  # noqa: E731
    eager = fn(q, k, v)
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("case,match", [
    ("q_3d", "q must be 4-D"),
    ("int_q", "q must be float16"),
    ("k_dtype", "k must have q's dtype"),
    ("kv_shape", "k and v must have the same shape"),
    ("heads", "batch and heads must match"),
    ("head_dim", r"head_dim must be one of \(32, 64, 96, 128\) \(the head dims a route serves\), got 12"),
    ("seq", "sequence length 100 must be a positive multiple"),
    ("map_dtype", "block_map must be a bool tensor"),
    ("map_shape", "block_map must have shape"),
    ("vbs_len", "variable_block_sizes must be 1-D with one entry per block"),
    ("vbs_range", r"variable_block_sizes must lie in \[0, 64\]"),
    ("vbs_float", "variable_block_sizes must be an integer tensor"),
    ("last_stride", "contiguous last"),
])
def test_bad_inputs_raise_clear_errors(case, match):
    q, k, v = _inputs(1, 2, 128, 128, 32)
    m = torch.ones(1, 2, 2, 2, dtype=torch.bool, device=DEV)
    s = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    if case == "q_3d":
        q = q[0]
    elif case == "int_q":
        q = q.to(torch.int32)
    elif case == "k_dtype":
        k = k.half()
    elif case == "kv_shape":
        v = v[:, :, :64]
    elif case == "heads":
        k, v = k[:, :1], v[:, :1]
    elif case == "head_dim":
        q, k, v = q[..., :12], k[..., :12], v[..., :12]
    elif case == "seq":
        q = q[:, :, :100]
    elif case == "map_dtype":
        m = m.int()
    elif case == "map_shape":
        m = m[:, :, :1]
    elif case == "vbs_len":
        s = s[:1]
    elif case == "vbs_range":
        s = torch.tensor([64, 65], dtype=torch.int32, device=DEV)
    elif case == "vbs_float":
        s = s.float()
    elif case == "last_stride":
        q = torch.empty(1, 2, 32, 128, device=DEV).transpose(2, 3)
    with pytest.raises((ValueError, TypeError), match=match):
        fvc.block_sparse_attn(q, k, v, m, s)


def test_vsa_bad_args():
    q, k, v = _inputs(1, 1, 128, 128, 32)
    s = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="block_size must have 64, 128 or 256 elements"):
        fvc.video_sparse_attn(q, k, v, s, s, 1, block_size=(2, 2, 2))
    with pytest.raises(ValueError, match="topk must be a positive int"):
        fvc.video_sparse_attn(q, k, v, s, s, 0)
    with pytest.raises(ValueError, match="q_variable_block_sizes must be 1-D"):
        fvc.video_sparse_attn(q, k, v, s, s[:1], 1)
    with pytest.raises(ValueError, match="compress_attn_weight must have q's shape"):
        fvc.video_sparse_attn(q, k, v, s, s, 1, compress_attn_weight=q[:, :, :64])


def test_range_check_sees_in_place_writes():
    q, k, v, m, s = _small()
    fvc.block_sparse_attn(q, k, v, m, s)
    s.fill_(70)
    with pytest.raises(ValueError, match="must lie in"):
        fvc.block_sparse_attn(q, k, v, m, s)


def test_vsa_all_kv_blocks_empty_gives_zero_not_nan():
    q, k, v = _inputs(1, 1, 128, 128, 32)
    zero = torch.zeros(2, dtype=torch.int32, device=DEV)
    full = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    out = fvc.video_sparse_attn(q, k, v, zero, full, 1)
    ref = video_sparse_attn_reference(q, k, v, zero, full, 1)
    assert (out == 0).all() and (ref == 0).all()


def test_vsa_gate_dtype_and_topk_validation():
    q, k, v = _inputs(1, 1, 128, 128, 32, dtype=torch.float16)
    s = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    with pytest.raises(TypeError, match="compress_attn_weight must have q's dtype"):
        fvc.video_sparse_attn(q, k, v, s, s, 1, compress_attn_weight=q.float())
    with pytest.raises(ValueError, match="topk must be a positive int"):
        fvc.topk_block_map(torch.randn(3, 5), -2)


def test_backward_uses_the_forward_route_even_if_env_changes(monkeypatch):
    """The route is recorded at forward time; flipping env vars before backward must not
    send the backward elsewhere (here: to a forced backend that does not exist)."""
    q, k, v, m, s = _small()
    q.requires_grad_(True)
    out, _ = fvc.block_sparse_attn(q, k, v, m, s)
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "nope")
    (dq,) = torch.autograd.grad(out.sum(), (q,))
    assert torch.isfinite(dq).all()


# ---------------------------------------------------------------- VSA's fused backward

def _vsa_case(bshd, seed=21):
    g = torch.Generator().manual_seed(seed)
    shape = (1, 192, 2, 32) if bshd else (1, 2, 192, 32)
    q, k, v, gate = (torch.randn(shape, generator=g).to(DEV) for _ in range(4))
    sizes = torch.tensor([64, 40, 17], dtype=torch.int32, device=DEV)
    fn = fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn
    return (q, k, v, gate), sizes, fn


@pytest.mark.parametrize("bshd", [False, True])
def test_vsa_backward_compiled_fullgraph_equals_eager(bshd):
    torch._dynamo.reset()
    base, sizes, vsa = _vsa_case(bshd)
    fn = lambda q, k, v, g: vsa(q, k, v, sizes, sizes, 2, 64, compress_attn_weight=g)  # noqa: E731
    results = []
    for f in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        leaves = [x.clone().requires_grad_(True) for x in base]
        out = f(*leaves)
        results.append((out,) + torch.autograd.grad(out, leaves, torch.ones_like(out)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_vsa_backward_adds_no_full_size_tensor():
    """The compression's gradient goes into the sparse one in place (vsa_autograd): no aten::add
    of a q-sized tensor in the backward (per-op autograd made three)."""
    from torch.profiler import ProfilerActivity, profile

    base, sizes, vsa = _vsa_case(False, seed=22)
    leaves = [x.clone().requires_grad_(True) for x in base]
    out = vsa(*leaves[:3], sizes, sizes, 2, 64, compress_attn_weight=leaves[3])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        out.backward(torch.ones_like(out))
    full = [list(base[0].shape)]
    adds = [e for e in prof.events() if e.name in ("aten::add", "aten::add_") and any(s in full for s in e.input_shapes)]
    assert not adds, [(e.name, e.input_shapes) for e in adds]
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in leaves)


def test_vsa_with_one_tensor_as_q_k_v_and_gate_compiles_and_sums_its_gradients():
    torch._dynamo.reset()
    (x, _, _, _), sizes, vsa = _vsa_case(False, seed=23)
    fn = lambda x: vsa(x, x, x, sizes, sizes, 2, 64, compress_attn_weight=x)  # noqa: E731
    ref_leaf = x.clone().requires_grad_(True)
    ref = video_sparse_attn_reference(ref_leaf, ref_leaf, ref_leaf, sizes, sizes, 2, block_size=64,
                                      compress_attn_weight=ref_leaf)
    (g_ref,) = torch.autograd.grad(ref, [ref_leaf], torch.ones_like(ref))
    for f in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        leaf = x.clone().requires_grad_(True)
        out = f(leaf)
        (g,) = torch.autograd.grad(out, [leaf], torch.ones_like(out))
        torch.testing.assert_close(out, ref, atol=FP32_TOL, rtol=FP32_TOL)
        torch.testing.assert_close(g, g_ref, atol=10 * FP32_TOL, rtol=10 * FP32_TOL)  # as the other VSA grads


def test_vsa_forward_hands_the_top_k_lists_to_the_op_without_a_bool_map(monkeypatch):
    """The top-k lists go to the sparse forward as lists: on a list-taking route (Triton at its
    native 64 tile here; cuDNN on a GPU) no bool map is built, and the result equals the
    map API's on the map of the same selection (vsa_autograd)."""
    from fastvideo_cute import metadata, vsa_ops
    from fastvideo_cute.backends import BACKENDS
    from fastvideo_cute.metadata import BlockSparsity, index_to_map

    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    (q, k, v, gate), sizes, vsa = _vsa_case(False, seed=23)
    built, seen = [], []
    monkeypatch.setattr(metadata, "index_to_map", lambda *a: built.append(1) or index_to_map(*a))
    real = BACKENDS["triton"].forward
    monkeypatch.setattr(BACKENDS["triton"], "forward", lambda *a, **kw: seen.append(a[3]) or real(*a, **kw))
    with torch.no_grad():
        out = vsa(q, k, v, sizes, sizes, 2, 64, compress_attn_weight=gate)
        assert len(seen) == 1 and isinstance(seen[0], BlockSparsity) and seen[0].has_lists
        assert not built
        qc, kc, vc = vsa_ops.vsa_compress(q, k, v, sizes, sizes, 64, False)
        out_c, idx, num = vsa_ops.vsa_select(qc, kc, vc, sizes, 2, 32 ** -0.5, q.dtype)
        out_s, _ = fvc.block_sparse_attn(q, k, v, index_to_map(idx, num, 3), sizes)
        want = vsa_ops.vsa_gate(out_s, out_c, gate, 64, False)
    assert torch.equal(out, want)


@pytest.mark.parametrize("need_grad", [False, True])
def test_vsa_compression_writes_the_padding_zeroed_kv_a_copying_route_reads(monkeypatch, need_grad):
    """For a backend that zeroes K/V padding by copying (cuDNN, FA4: ``zeroes_kv_padding``), the
    compression pass writes the copies instead (V; K too when a backward follows) and the backend
    is told so (``kv_padding_zero``). Emulated on the Triton route (which masks padding itself, so
    the results must not change at all): NaN padding, partial and full blocks."""
    from fastvideo_cute import vsa_autograd
    from fastvideo_cute.backends import BACKENDS

    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    (q, k, v, gate), sizes, vsa = _vsa_case(False, seed=24)
    for x in (k, v):
        x[:, :, 64 + 40:128] = float("nan")
        x[:, :, 128 + 17:] = float("nan")

    def run():
        leaves = [x.clone().requires_grad_(need_grad) for x in (q, k, v, gate)]
        with torch.set_grad_enabled(need_grad):
            out = vsa(*leaves[:3], sizes, sizes, 2, 64, compress_attn_weight=leaves[3])
            grads = torch.autograd.grad(out, leaves, torch.ones_like(out)) if need_grad else ()
        return (out,) + tuple(grads)

    want = run()
    be = BACKENDS["triton"]
    seen = spy_backend_calls(monkeypatch, be)
    monkeypatch.setattr(vsa_autograd, "_zeroes_padding", lambda name: name == "triton")
    got = run()
    for a, b in zip(want, got):
        assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) and torch.isfinite(a).all()
    fwd = [(a, kw) for n, a, kw in seen if n == "forward"]
    assert len(fwd) == 1 and fwd[0][1].get("kv_padding_zero") is True
    v_run = fwd[0][0][2]
    assert v_run is not v and torch.isfinite(v_run).all()
    assert torch.equal(v_run[:, :, :104], v[:, :, :104]) and not v_run[:, :, 104:128].any()
    bwd = [(a, kw) for n, a, kw in seen if n == "backward"]
    if need_grad:
        k_run = bwd[0][0][1]
        assert bwd[0][1].get("kv_padding_zero") is True and torch.isfinite(k_run).all()
        assert not k_run[:, :, 128 + 17:].any()
    else:
        assert not bwd


def test_vsa_clean_plan_only_for_partial_blocks_and_copying_backends(monkeypatch):
    from fastvideo_cute import vsa_autograd
    from fastvideo_cute.validation import check_sizes_range

    full = torch.full((3,), 64, dtype=torch.int32)
    part = torch.tensor([64, 40, 17], dtype=torch.int32)
    for t in (full, part):
        check_sizes_range(t, 64)
    plan = vsa_autograd._clean_plan
    assert plan("cudnn|cudnn", full, 64, True) == (False, False)
    assert plan("cudnn|cudnn", part, 64, True) == (True, True)
    assert plan("cudnn|cudnn", part, 64, False) == (True, False)
    assert plan("fa4|triton", part, 64, True) == (True, False)
    assert plan("triton|cudnn", part, 64, True) == (True, True)
    assert plan("triton|triton", part, 64, True) == (False, False)
    assert plan("triton", part, 64, False) == (False, False)
