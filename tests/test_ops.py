"""fastvideo_cute.ops: the custom ops' contract around the backends — the route recorded in the
graph, the range check under torch.compile, empty batches, meta tensors, forward-mode AD refused,
concurrent interpreter calls, and the dispatch counter tests use to observe which backend ran."""

import threading

import pytest
import torch
import torch.autograd.forward_ad as fwAD

import fastvideo_cute as fvc
from fastvideo_cute import ops
from fastvideo_cute.backends import registry
from fastvideo_cute.backends.triton_backend import TritonBackend

from .conftest import HAS_CUDA, spy_backend_calls

DEV = "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)


def _inputs(b=1, h=1, n=2, d=32, grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n * 64, d, generator=g).to(DEV).requires_grad_(grad) for _ in range(3))
    m = torch.ones(b, h, n, n, dtype=torch.bool, device=DEV)
    m[..., 0, 1] = False
    return q, k, v, m, torch.tensor([64, 40][:n] + [64] * max(0, n - 2), dtype=torch.int32, device=DEV)


class _Probe(TritonBackend):
    """The Triton backend under another name (a test-only backend to observe routing)."""

    name = "probe"


@pytest.fixture
def probe():
    backend = registry.register(_Probe())
    yield backend
    registry.REGISTRY.pop("probe")


def test_dispatch_counts_observe_the_backend_that_ran(probe, monkeypatch):
    q, k, v, m, s = _inputs(grad=True)
    before = ops.dispatch_counts.copy()
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "probe")
    out, _ = fvc.block_sparse_attn(q, k, v, m, s)
    out.sum().backward()
    assert ops.dispatch_counts[("probe", "fwd")] - before[("probe", "fwd")] == 1
    assert ops.dispatch_counts[("probe", "bwd")] - before[("probe", "bwd")] == 1
    assert ops.dispatch_counts[("triton", "fwd")] == before[("triton", "fwd")]


def test_compiled_forward_and_backward_stay_on_the_traced_route(probe, monkeypatch):
    torch._dynamo.reset()
    q, k, v, m, s = _inputs(grad=True)
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "probe")
    fn = torch.compile(lambda q, k, v: fvc.block_sparse_attn(q, k, v, m, s)[0], fullgraph=True, backend="aot_eager")
    fn(q, k, v)  # traced with FASTVIDEO_VSA_BACKEND=probe
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "triton")  # changed after compilation
    before = ops.dispatch_counts.copy()
    fn(q, k, v).sum().backward()
    delta = {key: ops.dispatch_counts[key] - before[key] for key in ops.dispatch_counts}
    assert delta.get(("probe", "fwd")) == 1 and delta.get(("probe", "bwd")) == 1, delta
    assert not delta.get(("triton", "fwd")) and not delta.get(("triton", "bwd")), delta


def test_range_check_holds_under_torch_compile():
    torch._dynamo.reset()
    q, k, v, m, _ = _inputs()
    bad = torch.tensor([-7, 1000], dtype=torch.int32, device=DEV)
    fn = torch.compile(lambda q, k, v, s: fvc.block_sparse_attn(q, k, v, m, s)[0], fullgraph=True,
                       backend="aot_eager")
    with pytest.raises(ValueError, match=r"variable_block_sizes must lie in \[0, 64\], got values in \[-7, 1000\]"):
        fn(q, k, v, bad)


@pytest.mark.parametrize("b,h", [(0, 2), (2, 0)])
def test_empty_batch_or_heads_give_empty_outputs_and_grads(b, h):
    q, k, v = (torch.randn(b, h, 128, 32, device=DEV, requires_grad=True) for _ in range(3))
    m = torch.ones(b, h, 2, 2, dtype=torch.bool, device=DEV)
    s = torch.full((2,), 64, dtype=torch.int32, device=DEV)
    out, lse = fvc.block_sparse_attn(q, k, v, m, s)
    assert out.shape == q.shape and lse.shape == (b, h, 128)
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_meta_tensors_take_the_fake_path():
    q, k, v = (torch.empty(1, 2, 128, 32, device="meta") for _ in range(3))
    m = torch.ones(1, 2, 2, 2, dtype=torch.bool, device="meta")
    s = torch.empty(2, dtype=torch.int32, device="meta")
    out, lse = fvc.block_sparse_attn(q, k, v, m, s)
    assert out.device.type == "meta" and out.shape == q.shape and lse.shape == (1, 2, 128)
    out = fvc.video_sparse_attn(q, k, v, s, s, 1, block_size=64)
    assert out.device.type == "meta" and out.shape == q.shape


def test_forward_ad_is_refused_not_a_zero_tangent():
    q, k, v, m, s = _inputs()
    with pytest.raises(ops.ForwardADError, match="no forward-mode AD"):
        torch.func.jvp(lambda q: fvc.block_sparse_attn(q, k, v, m, s)[0], (q,), (torch.ones_like(q),))
    with fwAD.dual_level():
        dual = fwAD.make_dual(v, torch.ones_like(v))
        with pytest.raises(ops.ForwardADError):
            fvc.block_sparse_attn(q, k, dual, m, s)
        with pytest.raises(ops.ForwardADError):
            fvc.video_sparse_attn(q, k, dual, s, s, 1, block_size=64)


@pytest.mark.skipif(HAS_CUDA, reason="the lock serialises Triton-interpreter launches (CPU tensors)")
def test_concurrent_interpreter_calls_from_threads():
    q, k, v, m, s = _inputs(n=2)
    ref, _ = fvc.block_sparse_attn(q, k, v, m, s)
    results, errors = [], []

    def work():
        try:
            results.append(fvc.block_sparse_attn(q, k, v, m, s)[0])
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 4 and all(torch.equal(r, ref) for r in results)


def _padded_case(bshd: bool, seed: int, pad: float, q_blocks: int = 3):
    """One 64-token call on the Triton route's inputs: kv 192 tokens in blocks of 64 / 40 / 17 valid
    keys whose padding rows hold ``pad``, ``q_blocks`` query blocks, an all-True map. Returns
    ``(k, v, seq, m, run)``: ``seq`` indexes the dims before the token dim, ``run()`` gives
    ``(out, dq, dk, dv)`` of a call on fresh leaves (``m`` may be edited before it)."""
    g = torch.Generator().manual_seed(seed)
    q_len = 64 * q_blocks
    q_shape, kv_shape = ((1, q_len, 2, 32), (1, 192, 2, 32)) if bshd else ((1, 2, q_len, 32), (1, 2, 192, 32))
    q, k, v, dout = (torch.randn(shape, generator=g).to(DEV) for shape in (q_shape, kv_shape, kv_shape, q_shape))
    sizes = torch.tensor([64, 40, 17], dtype=torch.int32, device=DEV)
    seq = (slice(None),) if bshd else (slice(None), slice(None))  # the dims before the token dim
    for x in (k, v):  # the padding rows of kv blocks 1 and 2
        x[seq + (slice(64 + 40, 128),)] = pad
        x[seq + (slice(128 + 17, None),)] = pad
    m = torch.ones(1, 2, q_blocks, 3, dtype=torch.bool, device=DEV)
    fn = fvc.block_sparse_attn_bshd if bshd else fvc.block_sparse_attn

    def run():
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out, _ = fn(*leaves, m, sizes)
        return (out,) + torch.autograd.grad(out, leaves, dout)

    return k, v, seq, m, run


@pytest.mark.parametrize("bshd", [False, True])
def test_eager_forward_zeroes_kv_padding_once_for_a_copying_route(monkeypatch, bshd):
    """With a backward to follow, some kv block partial and a route whose backends copy K/V to
    zero their padding (cuDNN, FA4: ``zeroes_kv_padding``), the eager forward makes one
    padding-zeroed K/V pair, both halves run on it (told so by ``kv_padding_zero``) and make no copy
    of their own. Emulated on the Triton route (it masks padding itself, so nothing may change):
    NaN padding, the results and gradients equal the plain run's."""
    from fastvideo_cute.backends import BACKENDS

    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    k, v, seq, m, run = _padded_case(bshd, 5, float("nan"))
    m[..., 0, 2] = False
    want = run()
    be = BACKENDS["triton"]
    seen = spy_backend_calls(monkeypatch, be)
    monkeypatch.setattr(type(be), "zeroes_kv_padding", True, raising=False)
    got = run()
    for a, b in zip(want, got):
        assert torch.isfinite(a).all() and torch.equal(a, b)
    [(_, fa, fkw)] = [s for s in seen if s[0] == "forward"]
    [(_, ba, bkw)] = [s for s in seen if s[0] == "backward"]
    assert fkw["kv_padding_zero"] is True and bkw["kv_padding_zero"] is True
    k_run, v_run = fa[1], fa[2]
    assert ba[1] is k_run and ba[2] is v_run  # the backward reuses the forward's copies
    for x, src in ((k_run, k), (v_run, v)):
        assert torch.isfinite(x).all()
        assert torch.equal(x[seq + (slice(0, 104),)], src[seq + (slice(0, 104),)])
        assert not x[seq + (slice(104, 128),)].any() and not x[seq + (slice(145, None),)].any()


def test_eager_forward_zeroes_nothing_without_backward_or_partial_blocks(monkeypatch):
    from fastvideo_cute.validation import check_sizes_range

    full = torch.full((3,), 64, dtype=torch.int32)
    part = torch.tensor([64, 40, 17], dtype=torch.int32)
    for t in (full, part):
        check_sizes_range(t, 64)
    assert ops._clean_once("cudnn|cudnn", part, 64, True)
    assert ops._clean_once("fa4|cudnn", part, 64, True)
    assert not ops._clean_once("cudnn|cudnn", part, 64, False)
    assert not ops._clean_once("cudnn|cudnn", full, 64, True)
    assert not ops._clean_once("fa4|triton", part, 64, True)
    assert not ops._clean_once("triton|cudnn", part, 64, True)
    assert not ops._clean_once(ops.EMPTY_ROUTE, part, 64, True)


def test_probe_wanted_only_where_the_backward_would_copy():
    from fastvideo_cute.validation import check_sizes_range

    full = torch.full((3,), 64, dtype=torch.int32)
    part = torch.tensor([64, 40, 17], dtype=torch.int32)
    for t in (full, part):
        check_sizes_range(t, 64)
    assert ops._probe_padding("sm90|cudnn", part, 64, True, False)
    assert ops._probe_padding("sm90|fa4", part, 64, True, False)
    assert ops._probe_padding("triton|cudnn", part, 64, True, False)
    assert not ops._probe_padding("sm90|cudnn", part, 64, True, True)  # the forward made the copies
    assert not ops._probe_padding("sm90|cudnn", part, 64, False, False)  # no backward
    assert not ops._probe_padding("sm90|cudnn", full, 64, True, False)  # nothing to copy
    assert not ops._probe_padding("cudnn|sm90", part, 64, True, False)  # masks padding in its kernel
    assert not ops._probe_padding("fa4|triton", part, 64, True, False)
    assert not ops._probe_padding(ops.EMPTY_ROUTE, part, 64, True, False)


@pytest.mark.parametrize("q_blocks", [3, 2])
@pytest.mark.parametrize("poison", [None, float("nan"), 0.5])
@pytest.mark.parametrize("bshd", [False, True])
def test_eager_probe_tells_the_backward_whether_padding_is_zero(monkeypatch, poison, bshd, q_blocks):
    """A route whose backward copies K/V to zero their padding and whose forward does not (emulated
    on the Triton route, which masks padding itself, so nothing may change): the forward probes the
    padding, the backward is told ``kv_padding_zero`` exactly when every padding row of K and V is
    zero (NaN or a finite non-zero value in one row of V: not), and results equal the plain run's;
    q_len == kv_len and q_len != kv_len (128 queries, 192 keys)."""
    from fastvideo_cute import padding_probe
    from fastvideo_cute.backends import BACKENDS

    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    k, v, seq, m, run = _padded_case(bshd, 6, 0.0, q_blocks)
    if poison is not None:
        v[seq + (slice(150, 151),)] = poison
    want = run()
    be = BACKENDS["triton"]
    seen = spy_backend_calls(monkeypatch, be)
    monkeypatch.setattr(type(be), "zeroes_kv_padding", True, raising=False)
    monkeypatch.setattr(ops, "_clean_once", lambda *a: False)  # the forward makes no copies
    before = padding_probe.probe_counts.copy()
    got = run()
    for a, b in zip(want, got):
        assert torch.isfinite(a).all() and torch.equal(a, b)
    [(_, _, bkw)] = [s for s in seen if s[0] == "backward"]
    assert bkw["kv_padding_zero"] is (poison is None)
    ran = {key: n - before[key] for key, n in padding_probe.probe_counts.items() if n != before[key]}
    assert ran == {"launched": 1, "zero" if poison is None else "nonzero": 1}, ran
