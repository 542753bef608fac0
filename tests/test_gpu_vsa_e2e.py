"""On a GPU: ``video_sparse_attn`` end to end on every backend that serves the call — against the
fp32 reference (forward and backward, gate and no gate, partial q and kv tiles, BHSD and BSHD),
under ``torch.compile(fullgraph=True)`` (inductor) and captured in a CUDA graph (forward +
backward, replayed on new values), and with no host synchronisation in a steady-state step.

Tolerances: the bf16-vs-fp32-reference ones of tests/test_gpu_mixed_backends.py (max |diff| /
max |ref|: out 1e-2, grads 2e-2). Compiled and graph-replayed results are compared with the eager
call on the same backend: bitwise for the Triton route (deterministic), and within 1e-2 of max
|ref| where the backward accumulates with float atomics (cuDNN's dQ), whose run-to-run differences
are a few bf16 ulps.
"""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import ops
from fastvideo_cute.backends import BACKENDS
from fastvideo_cute.call import call_info
from fastvideo_cute.reference import video_sparse_attn_reference

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():  # collected on CPU boxes too
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

OUT_TOL, GRAD_TOL, REPEAT_TOL = 1e-2, 2e-2, 1e-2
GRID, TILE = (5, 6, 10), (4, 4, 4)  # 2 x 2 x 3 tiles, partial in t, h and w
DETERMINISTIC = {"triton"}


def _nerr(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()


def _case(bshd, gate, seed=0, h=2, d=128):
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = GRID[0] * GRID[1] * GRID[2]
    raw = [torch.randn(1, h, n, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(4)]
    tiled = [fvc.to_tiles(x, GRID, TILE, dim=2) for x in raw]
    if bshd:
        tiled = [x.transpose(1, 2).contiguous() for x in tiled]
    sizes = fvc.variable_block_sizes(GRID, TILE, device="cuda")
    q, k, v, w = tiled
    return q, k, v, (w * 0.5 if gate else None), sizes


def _backends(bshd):
    q, k, _, _, sizes = _case(bshd, False)
    fvc.validation.check_sizes_range(sizes, 64)
    info = call_info(q, k, 64, True, bshd, False, sizes)
    cap = torch.cuda.get_device_capability()
    return [n for n, b in BACKENDS.items() if b.verified_on(cap) and b.support(info)[0]]


def _run(name, bshd, gate, monkeypatch, fn=None):
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", name)
    q, k, v, w, sizes = _case(bshd, gate)
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v) + ((w,) if w is not None else ())]
    vsa = fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn
    call = fn or (lambda *xs: vsa(xs[0], xs[1], xs[2], sizes, sizes, 3, TILE,
                                  compress_attn_weight=xs[3] if len(xs) > 3 else None))
    before = ops.dispatch_counts.copy()
    out = call(*leaves)
    dout = torch.randn(out.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(99)).to(out.dtype)
    grads = torch.autograd.grad(out, leaves, dout)
    ran = {key for key, n in ops.dispatch_counts.items() if n != before[key]}
    return leaves, sizes, out, dout, grads, ran


@pytest.mark.parametrize("bshd", [False, True])
@pytest.mark.parametrize("gate", [True, False])
def test_every_backend_matches_the_fp32_reference(monkeypatch, bshd, gate):
    names = _backends(bshd)
    assert "triton" in names
    for name in names:
        leaves, sizes, out, dout, grads, ran = _run(name, bshd, gate, monkeypatch)
        assert ran == {(name, "fwd"), (name, "bwd")}, ran
        tb = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
        ref_leaves = [tb(x).detach().float().requires_grad_(True) for x in leaves]
        ref = video_sparse_attn_reference(*ref_leaves[:3], sizes, sizes, 3, TILE,
                                          compress_attn_weight=ref_leaves[3] if gate else None)
        refg = torch.autograd.grad(ref, ref_leaves, tb(dout).float())
        errs = [_nerr(tb(out), ref)] + [_nerr(tb(g), r) for g, r in zip(grads, refg)]
        print(f"\n[vsa {name} bshd={bshd} gate={gate}] " + " ".join(f"{e:.2e}" for e in errs))
        assert errs[0] < OUT_TOL and max(errs[1:]) < GRAD_TOL, (name, errs)


@pytest.mark.parametrize("bshd", [False, True])
def test_torch_compile_fullgraph_inductor_forward_and_backward(monkeypatch, bshd):
    for name in _backends(bshd):
        torch._dynamo.reset()
        _, _, out, _, grads, _ = _run(name, bshd, True, monkeypatch)
        vsa = fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn
        sizes = _case(bshd, True)[4]
        compiled = torch.compile(lambda q, k, v, w: vsa(q, k, v, sizes, sizes, 3, TILE, compress_attn_weight=w),
                                 fullgraph=True)
        _, _, out_c, _, grads_c, ran = _run(name, bshd, True, monkeypatch, fn=compiled)
        assert (name, "fwd") in ran and (name, "bwd") in ran, ran
        for a, b in zip((out,) + grads, (out_c,) + grads_c):
            assert torch.equal(a, b) if name in DETERMINISTIC else _nerr(b, a) < REPEAT_TOL, name


@pytest.mark.parametrize("bshd", [False, True])
def test_cuda_graph_capture_of_forward_and_backward(monkeypatch, bshd):
    for name in _backends(bshd):
        monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", name)
        q, k, v, w, sizes = _case(bshd, True)
        static = [x.detach().clone().requires_grad_(True) for x in (q, k, v, w)]
        dout = torch.randn_like(q)
        vsa = fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn

        def step():
            out = vsa(static[0], static[1], static[2], sizes, sizes, 3, TILE, compress_attn_weight=static[3])
            return (out,) + torch.autograd.grad(out, static, dout)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up: compiles, and records the sizes' range check
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        new = _case(bshd, True, seed=5)
        with torch.no_grad():
            for s, x in zip(static, new[:4]):
                s.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        for a, b in zip(captured, eager):
            assert torch.isfinite(a).all()
            assert torch.equal(a, b) if name in DETERMINISTIC else _nerr(a, b) < REPEAT_TOL, name


def test_a_training_step_does_not_synchronise_the_host(monkeypatch):
    """Steady state (sizes checked once): no host sync in forward + backward on the default route."""
    for var in ("FASTVIDEO_VSA_BACKEND", "FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL"):
        monkeypatch.delenv(var, raising=False)
    q, k, v, w, sizes = _case(False, True)
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v, w)]

    def step():
        out = fvc.video_sparse_attn(*leaves[:3], sizes, sizes, 3, TILE, compress_attn_weight=leaves[3])
        torch.autograd.grad(out, leaves, torch.ones_like(out))

    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
