"""On an H200 (sm_90): ``video_sparse_attn`` / ``_bshd`` inference with a gate on 64-token tiles
takes the sm90 backend with the gate fused into its epilogue (``routes.select_vsa_routes``), on a
Wan-like latent grid whose q and kv tiles are partial in t, h and w, with NaN in K's and V's
padding rows. Checked: the route (the dispatch counter, the gated forward ran, no gate pass), the
output against the fp32 reference, and against the same call forced onto cuDNN and Triton
(``FASTVIDEO_VSA_BACKEND``); eager equals ``torch.compile(fullgraph=True)``; a grad-enabled call
takes the gated training op (out_s stored beside the composition; the backward on another
backend), its gradients checked against the fp32 reference and against the same call with the
gate pass.

Tolerances: max |out - ref| / max |ref| < 1e-2 (gradients 2e-2), the bf16-vs-fp32-reference
bounds of tests/test_gpu_vsa_e2e.py (itself tests/test_gpu_mixed_backends.py's); the same bound
between two routes' outputs; 1e-2 between two runs of a backward with float atomics (cuDNN).
"""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import ops, vsa_ops
from fastvideo_cute.backends import BACKENDS
from fastvideo_cute.reference import video_sparse_attn_reference

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):  # collected on CPU boxes too
    pytest.skip("needs an sm_90 GPU", allow_module_level=True)
pytest.importorskip("cutlass")
pytest.importorskip("cudnn")

OUT_TOL, GRAD_TOL, REPEAT_TOL = 1e-2, 2e-2, 1e-2
GRID, TILE = (5, 14, 26), (4, 4, 4)  # 2 x 4 x 7 tiles (3584 padded tokens), partial in t, h and w
TOPK = 8
ROUTE_VARS = ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND")


@pytest.fixture(autouse=True)
def _default_route(monkeypatch):
    for name in ROUTE_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("FASTVIDEO_VSA_ROUTE_TABLE", raising=False)


def _nerr(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()


def _case(bshd, dtype=torch.bfloat16, d=128, h=4, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = GRID[0] * GRID[1] * GRID[2]
    q, k, v, w = (fvc.to_tiles(torch.randn(1, h, n, d, device="cuda", generator=g).to(dtype), GRID, TILE, dim=2)
                  for _ in range(4))
    sizes = fvc.variable_block_sizes(GRID, TILE, device="cuda")
    pad = (torch.arange(q.shape[2], device="cuda") % 64) >= sizes.repeat_interleave(64)
    assert pad.any() and (sizes < 64).sum() > 1
    k[:, :, pad] = float("nan")  # the route must mask K/V padding (sm90 makes no clean copy)
    v[:, :, pad] = float("nan")
    gate = torch.sigmoid(w.float()).to(dtype)
    tensors = (q, k, v, gate)
    if bshd:
        tensors = tuple(x.transpose(1, 2).contiguous() for x in tensors)
    return tensors, sizes


def _call(tensors, sizes, bshd):
    vsa = fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn
    q, k, v, gate = tensors
    return vsa(q, k, v, sizes, sizes, TOPK, TILE, compress_attn_weight=gate)


def _reference(tensors, sizes, bshd):
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    q, k, v, gate = (tb(x).float() for x in tensors)
    ref = video_sparse_attn_reference(q, k, v, sizes, sizes, TOPK, TILE, compress_attn_weight=gate)
    return tb(ref)


def _spy(monkeypatch):
    seen = {"gated": 0, "gate_pass": 0}
    be = BACKENDS["sm90"]
    real = be.forward_gated
    monkeypatch.setattr(be, "forward_gated",
                        lambda *a, **kw: seen.__setitem__("gated", seen["gated"] + 1) or real(*a, **kw))
    real_gate = vsa_ops._gate_impl
    monkeypatch.setattr(vsa_ops, "_gate_impl",
                        lambda *a: seen.__setitem__("gate_pass", seen["gate_pass"] + 1) or real_gate(*a))
    return seen


def _ran(before):
    return {key: n - before[key] for key, n in ops.dispatch_counts.items() if n != before[key]}


@pytest.mark.parametrize("dtype,d", [(torch.bfloat16, 128), (torch.float16, 64)], ids=["bf16-d128", "fp16-d64"])
@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_gated_inference_takes_sm90_and_matches(monkeypatch, bshd, dtype, d):
    tensors, sizes = _case(bshd, dtype, d)
    seen = _spy(monkeypatch)
    before = ops.dispatch_counts.copy()
    with torch.no_grad():
        out = _call(tensors, sizes, bshd)
    torch.cuda.synchronize()
    assert _ran(before) == {("sm90", "fwd"): 1}
    assert seen == {"gated": 1, "gate_pass": 0}  # the gate composed in the epilogue, no gate pass
    assert out.shape == tensors[0].shape and out.dtype == dtype and out.is_contiguous()
    assert torch.isfinite(out).all()
    err = _nerr(out, _reference(tensors, sizes, bshd))
    print(f"\n[sm90 gated bshd={bshd} {dtype} d{d}] vs fp32 reference {err:.2e}")
    assert err < OUT_TOL, err
    for name in ("cudnn", "triton"):
        monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", name)
        before = ops.dispatch_counts.copy()
        with torch.no_grad():
            other = _call(tensors, sizes, bshd)
        assert _ran(before) == {(name, "fwd"): 1}
        diff = _nerr(out, other)
        print(f"[sm90 gated bshd={bshd} {dtype} d{d}] vs {name} {diff:.2e}")
        assert diff < OUT_TOL, (name, diff)
    assert seen["gated"] == 1


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_compiled_gated_inference_equals_eager(monkeypatch, bshd):
    torch._dynamo.reset()
    tensors, sizes = _case(bshd, seed=3)
    seen = _spy(monkeypatch)
    with torch.no_grad():
        eager = _call(tensors, sizes, bshd)
        compiled = torch.compile(lambda *xs: _call(xs, sizes, bshd), fullgraph=True)(*tensors)
    assert seen["gated"] >= 2 and seen["gate_pass"] == 0
    assert torch.equal(eager, compiled)  # the same kernel on the same inputs (run-to-run bitwise)


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_training_call_takes_the_fused_gate_and_matches(monkeypatch, bshd):
    """A training call whose forward the route table gives to sm90 runs the gated training op: the
    epilogue composes the gate and also stores out_s for the backward (no gate pass); the backward
    runs once, on the backend the route table gives it (``select_vsa_routes``: sm90's own backward
    since route table v9; cuDNN's before, when this test was written). Output and gradients against
    the fp32 reference (GRAD_TOL 2e-2: tests/test_gpu_vsa_e2e.py's bf16 bound)."""
    tensors, sizes = _case(bshd, seed=5)
    leaves = [x.detach().clone().requires_grad_(True) for x in tensors]
    seen = _spy(monkeypatch)
    before = ops.dispatch_counts.copy()
    out = _call(leaves, sizes, bshd)
    g = torch.Generator(device="cuda").manual_seed(9)
    dout = torch.randn(out.shape, device="cuda", generator=g).to(out.dtype)
    grads = torch.autograd.grad(out, leaves, dout)
    ran = _ran(before)
    assert ran.get(("sm90", "fwd")) == 1, ran
    assert seen == {"gated": 1, "gate_pass": 0}, (seen, ran)
    from fastvideo_cute.call import call_info
    from fastvideo_cute.routes import select_vsa_routes

    info = call_info(leaves[0], leaves[1], 64, True, bshd, need_lse=False, kv_block_sizes=sizes)
    bwd_backend = select_vsa_routes(info, gated=True)[1]
    assert [key for key in ran if key[1] == "bwd"] == [(bwd_backend.name, "bwd")], (bwd_backend.name, ran)
    assert ran[(bwd_backend.name, "bwd")] == 1, ran
    tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
    ref_leaves = [tb(x).detach().float().requires_grad_(True) for x in leaves]
    ref = video_sparse_attn_reference(*ref_leaves[:3], sizes, sizes, TOPK, TILE, compress_attn_weight=ref_leaves[3])
    refg = torch.autograd.grad(ref, ref_leaves, tb(dout).float())
    errs = [_nerr(tb(out), ref)] + [_nerr(tb(x), r) for x, r in zip(grads, refg)]
    print(f"\n[sm90 gated training bshd={bshd}] out, dq, dk, dv, dgate vs fp32 reference "
          + " ".join(f"{e:.2e}" for e in errs))
    assert errs[0] < OUT_TOL and max(errs[1:]) < GRAD_TOL, errs
    # the same call with the gate pass (fused gate off): the same out_s and LSE reach the backward,
    # so the output is within one bf16 rounding and the gradients agree to the backward's own
    # run-to-run spread (cuDNN's float atomics; REPEAT_TOL of tests/test_gpu_vsa_e2e.py)
    from fastvideo_cute import vsa_autograd

    monkeypatch.setattr(vsa_autograd, "_fuses_gate", lambda route: False)
    leaves2 = [x.detach().clone().requires_grad_(True) for x in tensors]
    out2 = _call(leaves2, sizes, bshd)
    grads2 = torch.autograd.grad(out2, leaves2, dout)
    assert seen["gated"] == 1 and seen["gate_pass"] == 1
    assert _nerr(out, out2) <= 2.0 ** -7, _nerr(out, out2)
    for a, b in zip(grads, grads2):
        assert _nerr(a, b) < REPEAT_TOL, _nerr(a, b)
    # Without a gate, inference takes select_routes' backend and no fused gate (the rule needs one).
    seen["gated"] = 0
    with torch.no_grad():
        q, k, v, _ = tensors
        (fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn)(q, k, v, sizes, sizes, TOPK, TILE)
    assert seen["gated"] == 0


def test_compiled_gated_training_equals_eager(monkeypatch):
    """torch.compile(fullgraph=True) of the gated training call traces the gated training op; its
    output and gradients equal the eager call's within REPEAT_TOL (cuDNN's backward is not
    run-to-run bitwise)."""
    torch._dynamo.reset()
    tensors, sizes = _case(False, seed=6)
    seen = _spy(monkeypatch)

    def run(fn):
        leaves = [x.detach().clone().requires_grad_(True) for x in tensors]
        out = fn(*leaves)
        return (out.detach(), *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    eager = run(lambda *xs: _call(xs, sizes, False))
    compiled = run(torch.compile(lambda *xs: _call(xs, sizes, False), fullgraph=True))
    assert seen["gated"] >= 2 and seen["gate_pass"] == 0, seen
    for a, b in zip(compiled, eager):
        assert _nerr(a, b) < REPEAT_TOL, _nerr(a, b)


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_cuda_graph_capture_of_gated_inference(monkeypatch, bshd):
    """The fused-gate inference call captured in a CUDA graph (no host sync, no allocation the
    replay cannot repeat): a replay on new inputs equals the eager call on them, bit for bit (the
    same kernels on the same inputs), and the captured call took the fused gate."""
    tensors, sizes = _case(bshd, seed=7)
    static = [x.clone() for x in tensors]
    seen = _spy(monkeypatch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compiles, and records the sizes' range check
            _call(static, sizes, bshd)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        captured = _call(static, sizes, bshd)
    assert seen["gated"] == 3 and seen["gate_pass"] == 0
    new, _ = _case(bshd, seed=8)
    for s, x in zip(static, new):
        s.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        eager = _call(new, sizes, bshd)
    assert torch.isfinite(captured).all()
    assert torch.equal(captured, eager)
    assert _nerr(captured, _reference(new, sizes, bshd)) < OUT_TOL


@pytest.mark.parametrize("groups", [2, 3])
@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_head_groups_equal_the_unsplit_call(monkeypatch, bshd, groups):
    """``vsa_ops._GATED_HEAD_GROUPS`` (``vsa_pipeline``): the glue of each head group beside the
    previous group's sparse kernel gives the unsplit call's output bit for bit (per head the same
    kernels on the same inputs), one fused-gate sparse launch per group, no gate pass."""
    tensors, sizes = _case(bshd, seed=11)
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 1)
    with torch.no_grad():
        whole = _call(tensors, sizes, bshd)
    seen = _spy(monkeypatch)
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", groups)
    monkeypatch.setattr(vsa_ops, "_GATED_GROUP_MIN_TILES", 0)  # split this small case too
    before = ops.dispatch_counts.copy()
    with torch.no_grad():
        split = _call(tensors, sizes, bshd)
    torch.cuda.synchronize()
    assert _ran(before) == {("sm90", "fwd"): groups}
    assert seen == {"gated": groups, "gate_pass": 0}
    assert split.shape == whole.shape and split.is_contiguous()
    assert torch.equal(split, whole)
    assert _nerr(split, _reference(tensors, sizes, bshd)) < OUT_TOL


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_head_groups_under_cuda_graph_capture_and_compile(monkeypatch, bshd):
    """Captured with head groups (the glue stream forks from and joins the capturing stream): a
    replay on new inputs equals the eager unsplit call on them, bit for bit; under torch.compile
    the call is not split (traced as one) and equals it too."""
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 2)
    monkeypatch.setattr(vsa_ops, "_GATED_GROUP_MIN_TILES", 0)
    tensors, sizes = _case(bshd, seed=13)
    static = [x.clone() for x in tensors]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            _call(static, sizes, bshd)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        captured = _call(static, sizes, bshd)
    new, _ = _case(bshd, seed=14)
    for s, x in zip(static, new):
        s.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 1)
    with torch.no_grad():
        eager = _call(new, sizes, bshd)
    assert torch.equal(captured, eager)
    torch._dynamo.reset()
    monkeypatch.setattr(vsa_ops, "_GATED_HEAD_GROUPS", 2)
    with torch.no_grad():
        compiled = torch.compile(lambda *xs: _call(xs, sizes, bshd), fullgraph=True)(*new)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("bshd", [False, True], ids=["bhsd", "bshd"])
def test_kv_split_forward_through_video_sparse_attn(monkeypatch, bshd):
    """The sm90 forward split in two kv ranges (forced: ``sm90_backend._KV_SPLITS = 2``; "auto" splits
    only where one head's K/V outgrow the L2) through video_sparse_attn, inference with the fused gate
    and training with out_s: output (and gradients) against the fp32 reference and against the
    unsplit call (OUT_TOL: the earlier range's output is rounded once more before the merge)."""
    from fastvideo_cute.backends import sm90_backend

    tensors, sizes = _case(bshd, seed=11)
    runs = {}
    for splits in (1, 2):
        monkeypatch.setattr(sm90_backend, "_KV_SPLITS", splits)
        with torch.no_grad():
            inf = _call(tensors, sizes, bshd)
        leaves = [x.detach().clone().requires_grad_(True) for x in tensors]
        out = _call(leaves, sizes, bshd)
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
        runs[splits] = (inf, out.detach(), grads)
    ref = _reference(tensors, sizes, bshd)
    for splits, (inf, out, grads) in runs.items():
        assert _nerr(inf, ref) < OUT_TOL and _nerr(out, ref) < OUT_TOL, splits
        assert all(torch.isfinite(g).all() for g in grads)
    assert _nerr(runs[2][0], runs[1][0]) < OUT_TOL and _nerr(runs[2][1], runs[1][1]) < OUT_TOL
    for a, b in zip(runs[2][2], runs[1][2]):
        assert _nerr(a, b) < GRAD_TOL
