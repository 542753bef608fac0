"""The sm90 backend (our wgmma 64-token forward, gate fusable) on synthetic calls: what it serves,
each limit's reason, and that the router never picks it for plain block-sparse calls."""

import dataclasses
import importlib.util

import pytest
import torch

from fastvideo_cute import routes
from fastvideo_cute.backends import BACKENDS
from fastvideo_cute.call import CallInfo

HAS_CUTE = importlib.util.find_spec("cutlass") is not None

# A Wan-like VSA inference call on the H200: 64-token blocks, partial kv tiles, LSE discarded.
BASE = CallInfo("block_sparse", "cuda", (9, 0), torch.bfloat16, 128, 64, False, batch=1, heads=12, q_len=32768,
                kv_len=32768, need_lse=False, kv_all_full=False)


def _with(**kw):
    return dataclasses.replace(BASE, **kw)


def test_attributes():
    be = BACKENDS["sm90"]
    assert be.name == "sm90" and be.head_dims == (64, 128)
    assert be.zeroes_kv_padding is False  # it masks K/V padding in the kernel: no clean copy for it
    assert be.fuses_gate is True and callable(be.forward_gated)


def test_verified_on_sm90_only():
    be = BACKENDS["sm90"]
    assert be.verified_on((9, 0))
    assert not any(be.verified_on(a) for a in ((8, 0), (10, 0), (12, 1), None))


@pytest.mark.skipif(not HAS_CUTE, reason="the CuTe DSL is not installed")
@pytest.mark.parametrize("change", [dict(), dict(dtype=torch.float16), dict(head_dim=64), dict(need_lse=True),
                                    dict(kv_all_full=True), dict(bshd=True), dict(kv_len=4096), dict(batch=2)])
def test_serves_the_forward_it_was_verified_on(change):
    ok, reason = BACKENDS["sm90"].support(_with(**change))
    assert ok, reason


@pytest.mark.parametrize("change,words", [
    (dict(device_type="cpu", arch=None), "needs CUDA tensors"),
    (dict(arch=(10, 0)), "sm_90a only, not sm_100"),
    (dict(arch=(12, 1)), "sm_90a only, not sm_121"),
    (dict(need_grad=True), "inference only"),
    (dict(block_size=128), "64-token blocks only, got 128"),
    (dict(block_size=256), "64-token blocks only, got 256"),
    (dict(dtype=torch.float32), "float16 or bfloat16 only"),
    (dict(head_dim=96), "head_dim one of (64, 128), got 96"),
    (dict(head_dim=32), "head_dim one of (64, 128), got 32"),
    (dict(q_len=32768 + 32), "q_len 32800 is not a multiple of 64"),
    (dict(heads=70000), "launch limits"),
    (dict(batch=70000), "launch limits"),
])
def test_support_refuses_with_reason(change, words):
    ok, reason = BACKENDS["sm90"].support(_with(**change))
    assert not ok and words in reason, reason


def test_support_says_when_the_cute_dsl_is_missing(monkeypatch):
    from fastvideo_cute.backends import sm90_backend

    monkeypatch.setattr(sm90_backend, "module_installed", lambda name: name != "cutlass")
    ok, reason = BACKENDS["sm90"].support(BASE)
    assert not ok and "CuTe DSL is not installed" in reason


def test_compile_keys_name_the_kernel_and_the_gate_variant():
    be = BACKENDS["sm90"]
    keys = be.compile_keys(BASE)
    assert set(keys) == {"fwd"}
    detail = dict(keys["fwd"].detail)
    assert detail["kernel"] == "block_sparse_fwd64_sm90" and detail["gate"] == "none"
    gated = be.compile_keys(BASE, gated=True)["fwd"]
    assert dict(gated.detail)["gate"] == "fused" and gated.digest() != keys["fwd"].digest()
    full = be.compile_keys(_with(kv_all_full=True))["fwd"]  # no sizes: another compiled variant
    assert full.digest() != keys["fwd"].digest()


def test_never_an_automatic_choice_for_plain_block_sparse_calls(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    for info in (BASE, _with(need_lse=True), _with(kv_all_full=True, need_lse=True)):
        assert "sm90" not in routes.cute_preferences(info)
        assert routes.select_route(info).name != "sm90"
        monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
        assert routes.select_route(info).name != "sm90"
        monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL")
    # The shipped route table does not list it.
    from fastvideo_cute.route_table import DEFAULT_PATH

    if DEFAULT_PATH.is_file():
        assert '"sm90"' not in DEFAULT_PATH.read_text()


@pytest.mark.skipif(not HAS_CUTE, reason="the CuTe DSL is not installed")
def test_reachable_by_name_for_a_forward_only_call(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm90")
    assert routes.select_route(_with(need_lse=True)).name == "sm90"


def test_forced_on_a_training_call_raises_with_the_reason(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm90")
    with pytest.raises(routes.RouteError, match="FASTVIDEO_VSA_BACKEND=sm90 cannot serve this call: inference only"):
        routes.select_route(_with(need_grad=True))


def test_importing_the_backend_does_not_import_the_cute_dsl():
    import subprocess
    import sys

    code = ("import sys, fastvideo_cute.backends.sm90_backend as b; from fastvideo_cute.backends import BACKENDS; "
            "import torch; from fastvideo_cute.call import CallInfo; "
            "BACKENDS['sm90'].support(CallInfo('block_sparse', 'cuda', (9, 0), torch.bfloat16, 128, 64, False)); "
            "print('cutlass' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def _aligned_empty(*shape):
    """A bf16 CPU tensor whose base is 128-byte aligned (CPU allocations are only 64-byte aligned)."""
    n = 1
    for e in shape:
        n *= e
    buf = torch.randn(n + 64).to(torch.bfloat16)
    off = (-buf.data_ptr() % 128) // 2
    return buf[off:off + n].view(*shape)


def test_tensors_that_do_not_suit_tma_are_copied_before_the_launch():
    from fastvideo_cute.adapters.cute_sm90_fwd64 import tma_problem
    from fastvideo_cute.backends.sm90_backend import _ready

    x = _aligned_empty(1, 2, 136, 64)
    assert tma_problem("q", x) is None
    assert "gate's base address" in tma_problem("gate", x.view(-1)[1:1 + 2 * 128 * 64].view(1, 2, 128, 64))
    assert "non-unit last stride" in tma_problem("q", x.transpose(-1, -2))
    assert "outer stride" in tma_problem("k", _aligned_empty(4, 9)[:, :8])
    assert _ready("q", x) is x
    t = x.transpose(-1, -2)
    r = _ready("q", t)
    assert r is not t and r.is_contiguous() and torch.equal(r, t)
