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
                                    dict(kv_all_full=True), dict(bshd=True), dict(kv_len=4096), dict(batch=2),
                                    dict(block_size=128), dict(block_size=256)])
def test_serves_the_forward_it_was_verified_on(change):
    ok, reason = BACKENDS["sm90"].support(_with(**change))
    assert ok, reason


@pytest.mark.parametrize("change,words", [
    (dict(device_type="cpu", arch=None), "needs CUDA tensors"),
    (dict(arch=(10, 0)), "sm_90a only, not sm_100"),
    (dict(arch=(12, 1)), "sm_90a only, not sm_121"),
    (dict(need_grad=True), "inference only"),
    (dict(block_size=32), "block_size one of (64, 128, 256), got 32"),
    (dict(block_size=512), "block_size one of (64, 128, 256), got 512"),
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


def test_the_shipped_table_picks_it_where_it_was_fastest(monkeypatch):
    """The measured table (benchmarks/results/vsa_h200_table5_*.json) ranks sm90 first for the
    sm_90 64-token forward classes and the 128/256-token partial-tile ones; a training call pairs
    it with cuDNN's backward at 64 tokens, FA4's at 128/256; FA4 keeps the 128/256 full-tile
    forwards; without the table (legacy rules) it is never chosen."""
    from fastvideo_cute import route_table

    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(route_table.TABLE_ENV, raising=False)
    if routes._table() is None or not BACKENDS["cudnn"].support(_with(need_grad=True))[0]:
        pytest.skip("the shipped table or cuDNN-frontend is not usable here")
    for info in (BASE, _with(need_lse=True), _with(kv_all_full=True, need_lse=True)):
        assert "sm90" not in routes.cute_preferences(info)
        assert routes.select_route(info).name == "sm90"
    fwd, bwd = routes.select_routes(_with(need_grad=True))
    assert (fwd.name, bwd.name) == ("sm90", "cudnn")
    for block in (128, 256):
        assert routes.select_route(_with(block_size=block)).name == "sm90"  # partial tiles
        assert routes.select_route(_with(block_size=block, kv_all_full=True)).name == "fa4"
        fwd, bwd = routes.select_routes(_with(block_size=block, need_grad=True))
        assert (fwd.name, bwd.name) == ("sm90", "fa4")
    monkeypatch.setenv(route_table.TABLE_ENV, "off")
    for info in (BASE, _with(kv_all_full=True, need_lse=True)):
        assert routes.select_route(info).name != "sm90"


def test_forward_of_a_training_call_runs(monkeypatch):
    """The route table may pair this forward with another backend's backward: ``forward`` with
    ``need_backward=True`` runs the kernel like an inference call (its LSE serves the backward)
    instead of refusing (a refusal there failed every 64-token training call on the H200 once the
    table chose sm90 for the forward: benchmarks/results/vsa_h200_default_synthetic_v9.json)."""
    from fastvideo_cute.backends.sm90_backend import Sm90Backend

    seen = []
    backend = Sm90Backend()
    monkeypatch.setattr(backend, "_run", lambda *a, **kw: seen.append(a) or ("out", "lse"))
    assert backend.forward(1, 2, 3, None, None, block_size=64, bshd=False, need_backward=True,
                           sm_scale=0.1) == ("out", "lse")
    assert len(seen) == 1
