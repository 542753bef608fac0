"""video_sparse_attn's fused-gate path (vsa_autograd -> ops.block_sparse_attn_fwd_gated, and
block_sparse_attn_fwd_gated_train with grad), emulated on the Triton route without a GPU: a
test-only backend with ``fuses_gate`` runs the Triton forward and the gate op itself, so the
results (outputs and gradients) must equal the plain Triton route's bit for bit. Checks which op
runs (gated forward, no gate pass, no padding-zeroed copy), in eager mode and under
torch.compile(fullgraph), and the ops' fake implementations."""

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import ops, vsa_autograd, vsa_ops
from fastvideo_cute.backends import registry
from fastvideo_cute.backends.triton_backend import TritonBackend

from .conftest import HAS_CUDA

DEV = "cuda" if HAS_CUDA else "cpu"


class _GatedProbe(TritonBackend):
    """Triton's forward with the gate composed inside ``forward_gated`` (as sm90's epilogue does)."""

    name = "gprobe"
    zeroes_kv_padding = False
    fuses_gate = True

    def __init__(self):
        self.gated_calls = 0

    def forward_gated(self, q, k, v, sparsity, kv_block_sizes, gate, out_c, *, block_size, bshd, sm_scale,
                      out_s=None):
        self.gated_calls += 1
        self.out_s_calls = getattr(self, "out_s_calls", 0) + (out_s is not None)
        res, lse = self.forward(q, k, v, sparsity, kv_block_sizes, block_size=block_size, bshd=bshd,
                                need_backward=out_s is not None, sm_scale=sm_scale)
        if out_s is not None:
            out_s.copy_(res)
        return vsa_ops._gate_impl(res, out_c, gate, block_size, bshd), lse


@pytest.fixture
def gprobe(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    backend = registry.register(_GatedProbe())
    yield backend
    registry.REGISTRY.pop("gprobe")


def _case(bshd, seed=31):
    g = torch.Generator().manual_seed(seed)
    shape = (1, 192, 2, 32) if bshd else (1, 2, 192, 32)
    q, k, v, gate = (torch.randn(shape, generator=g).to(DEV) for _ in range(4))
    sizes = torch.tensor([64, 40, 17], dtype=torch.int32, device=DEV)
    for x in (k, v):  # NaN padding: the route must mask it (no clean copy is made for it)
        pad = (torch.arange(192, device=DEV) % 64) >= sizes.repeat_interleave(64)
        if bshd:
            x[:, pad] = float("nan")
        else:
            x[:, :, pad] = float("nan")
    return (q, k, v, gate), sizes, (fvc.video_sparse_attn_bshd if bshd else fvc.video_sparse_attn)


def _spy(monkeypatch):
    calls = {"gate": 0, "fwd": 0, "clean": 0}
    for op, key in (("_gate_impl", "gate"), ("_compress_clean_impl", "clean")):
        real = getattr(vsa_ops, op)
        monkeypatch.setattr(vsa_ops, op, lambda *a, _r=real, _k=key: calls.__setitem__(_k, calls[_k] + 1) or _r(*a))
    real_fwd = ops._fwd_impl
    monkeypatch.setattr(ops, "_fwd_impl", lambda *a: calls.__setitem__("fwd", calls["fwd"] + 1) or real_fwd(*a))
    return calls


@pytest.mark.parametrize("bshd", [False, True])
def test_inference_with_a_gate_runs_the_fused_forward(gprobe, monkeypatch, bshd):
    (q, k, v, gate), sizes, vsa = _case(bshd)
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    with torch.no_grad():
        want = vsa(q, k, v, sizes, sizes, 2, 64, compress_attn_weight=gate)
    monkeypatch.delenv("FASTVIDEO_VSA_TRITON")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "gprobe")
    calls = _spy(monkeypatch)
    before = ops.dispatch_counts.copy()
    with torch.no_grad():
        got = vsa(q, k, v, sizes, sizes, 2, 64, compress_attn_weight=gate)
    assert gprobe.gated_calls == 1
    assert calls == {"gate": 1, "fwd": 0, "clean": 0}  # the one gate call is the probe's own
    assert ops.dispatch_counts[("gprobe", "fwd")] - before[("gprobe", "fwd")] == 1
    assert torch.isfinite(got).all() and torch.equal(got, want)


def test_no_gate_takes_the_plain_forward_and_the_gate_pass(gprobe, monkeypatch):
    (q, k, v, gate), sizes, vsa = _case(False)
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "gprobe")
    calls = _spy(monkeypatch)
    with torch.no_grad():
        vsa(q, k, v, sizes, sizes, 2, 64)  # no gate: out_s + out_c through the gate op
    assert gprobe.gated_calls == 0 and calls["gate"] == 1 and calls["fwd"] == 1
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    out = vsa(*leaves, sizes, sizes, 2, 64)
    assert gprobe.gated_calls == 0 and calls["gate"] == 2 and calls["fwd"] == 2
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("bshd", [False, True])
def test_training_with_a_gate_runs_the_fused_forward_with_out_s(gprobe, monkeypatch, bshd):
    """With grad, the gated training op: one gated forward that also fills out_s, no plain forward
    and no gate pass of the glue; output and every gradient equal the plain Triton route's bit for
    bit (the backward reads the same out_s and LSE)."""
    (q, k, v, gate), sizes, vsa = _case(bshd, seed=33)
    g = torch.Generator().manual_seed(5)
    dout = torch.randn(q.shape, generator=g).to(DEV)

    def run():
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, gate)]
        out = vsa(*leaves[:3], sizes, sizes, 2, 64, compress_attn_weight=leaves[3])
        return (out.detach(), *torch.autograd.grad(out, leaves, dout))

    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    want = run()
    monkeypatch.delenv("FASTVIDEO_VSA_TRITON")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "gprobe")
    calls = _spy(monkeypatch)
    got = run()
    assert gprobe.gated_calls == 1 and gprobe.out_s_calls == 1
    assert calls == {"gate": 1, "fwd": 0, "clean": 0}  # the one gate call is the probe's own
    for name, a, b in zip(("out", "dq", "dk", "dv", "dgate"), got, want):
        assert torch.isfinite(a).all() and torch.equal(a, b), name


def test_the_fused_route_makes_no_clean_copy():
    part = torch.tensor([64, 40, 17], dtype=torch.int32)
    from fastvideo_cute.validation import check_sizes_range

    check_sizes_range(part, 64)
    assert vsa_autograd._clean_plan("sm90|sm90", part, 64, False) == (False, False)
    assert vsa_autograd._fuses_gate("sm90|sm90") and not vsa_autograd._fuses_gate("cudnn|cudnn")
    assert not vsa_autograd._fuses_gate(ops.EMPTY_ROUTE)


@pytest.mark.parametrize("bshd", [False, True])
def test_compiled_fullgraph_traces_the_gated_op(gprobe, monkeypatch, bshd):
    torch._dynamo.reset()
    (q, k, v, gate), sizes, vsa = _case(bshd, seed=32)
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "gprobe")
    fn = lambda q, k, v, g: vsa(q, k, v, sizes, sizes, 2, 64, compress_attn_weight=g)  # noqa: E731
    with torch.no_grad():
        eager = fn(q, k, v, gate)
        calls = gprobe.gated_calls
        compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")(q, k, v, gate)
    assert gprobe.gated_calls > calls  # the traced graph ran the gated op
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("bshd", [False, True])
def test_the_gated_op_has_a_fake_implementation(bshd):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        shape = (2, 192, 3, 64) if bshd else (2, 3, 192, 64)
        q, k, v, gate = (torch.empty(shape, dtype=torch.bfloat16) for _ in range(4))
        sizes = torch.empty(3, dtype=torch.int32)
        idx, num = torch.empty(2, 3, 3, 2, dtype=torch.int32), torch.empty(2, 3, 3, dtype=torch.int32)
        out_c = torch.empty(2, 3, 3, 64, dtype=torch.bfloat16)
        out = ops._fwd_gated(q, k, v, sizes, 64, bshd, 0.125, "sm90|sm90", True, idx, num, gate, out_c)
        out2, out_s, lse = ops._fwd_gated_train(q, k, v, sizes, 64, bshd, 0.125, "sm90|cudnn", True, idx, num, gate,
                                                out_c)
    contiguous = torch.empty(shape).stride()
    assert out.shape == q.shape and out.dtype == q.dtype and out.stride() == contiguous
    for x in (out2, out_s):
        assert x.shape == q.shape and x.dtype == q.dtype and x.stride() == contiguous
    assert lse.shape == (2, 3, 192) and lse.dtype == torch.float32


def test_compiled_fullgraph_traces_the_gated_training_op(gprobe, monkeypatch):
    """torch.compile(fullgraph) of a training call with a gate traces the gated training op (its fake
    implementation) and gives the eager call's output and gradients."""
    torch._dynamo.reset()
    (q, k, v, gate), sizes, vsa = _case(False, seed=34)
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "gprobe")
    fn = lambda q, k, v, g: vsa(q, k, v, sizes, sizes, 2, 64, compress_attn_weight=g)  # noqa: E731

    def run(f):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v, gate)]
        out = f(*leaves)
        return (out.detach(), *torch.autograd.grad(out, leaves, torch.ones_like(out)))

    eager = run(fn)
    calls = gprobe.out_s_calls
    compiled = run(torch.compile(fn, fullgraph=True, backend="aot_eager"))
    assert gprobe.out_s_calls > calls  # the traced graph ran the gated training op
    for a, b in zip(compiled, eager):
        assert torch.equal(a, b)
