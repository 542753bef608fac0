"""Route selection on synthetic calls (no GPU needed): which backend serves what, and why not."""

import dataclasses

import pytest
import torch

from fastvideo_cute import routes
from fastvideo_cute.backends import BACKENDS
from fastvideo_cute.routes import CallInfo, RouteError, select_route

BASE = CallInfo("block_sparse", "cuda", (12, 1), torch.bfloat16, 128, 128, False, batch=1, heads=12,
                q_len=32768, kv_len=32768, need_lse=False, kv_all_full=True)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FASTVIDEO_VSA_ROUTE_TABLE", "off")  # the rules without the table (test_route_table.py: with)
    monkeypatch.setattr(routes, "_LOGGED", set())


def _with(**kw):
    return dataclasses.replace(BASE, **kw)


def test_default_is_triton():
    assert select_route(BASE).name == "triton"


def test_cute_on_sm121_picks_the_sm120_kernel_for_inference(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    assert select_route(BASE).name == "sm120"
    assert select_route(_with(arch=(12, 0), block_size=256)).name == "sm120"


@pytest.mark.parametrize("change,words", [
    (dict(need_grad=True), "inference only"),
    (dict(need_lse=True), "returns no LSE"),
    (dict(kv_all_full=False), "ragged variable_block_sizes"),
    (dict(block_size=64), "128- or 256-token blocks only"),
    (dict(dtype=torch.float16), "bfloat16 only"),
    (dict(head_dim=64), "head_dim 128 only"),
    (dict(kv_len=16384), "q_len == kv_len"),
    (dict(batch=1, heads=70000), "launch limits"),
    (dict(arch=(10, 0)), "targets sm_90/sm_120/sm_121"),
])
def test_sm120_support_refuses_with_reason(change, words, monkeypatch, caplog):
    ok, reason = BACKENDS["sm120"].support(_with(**change))
    assert not ok and words in reason
    # Asked for CuTe on a GB10: falls back to Triton and logs that reason once (batch * heads past
    # the grid limit is refused by Triton too: tested in test_triton_refuses_grid_past_its_limit).
    if change.get("arch", (12, 1))[0] == 12 and "heads" not in change:
        monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
        with caplog.at_level("WARNING", logger="fastvideo_cute"):
            assert select_route(_with(**change)).name == "triton"
            select_route(_with(**change))
        assert sum(words in r.getMessage() for r in caplog.records) == 1


def test_sm90_prefers_fa4_and_reaches_sm120_only_by_name(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    info = _with(arch=(9, 0))
    assert select_route(info).name in ("fa4", "triton")  # fa4 when flash-attn-4 is installed
    assert select_route(info).name != "sm120"
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm120")
    assert select_route(info).name == "sm120"


def test_forced_sm120_that_cannot_serve_raises(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm120")
    with pytest.raises(RouteError, match="inference only"):
        select_route(_with(need_grad=True))


def test_fa4_64_token_backward_goes_to_sm90_or_triton_with_reason(monkeypatch, caplog):
    """FA4 cannot serve a 64-token backward on sm_90 (128-wide kv tiles): our warp-specialized
    backward (sm90) serves the bf16 / head_dim 128 / even-block calls it covers; the others fall back
    to Triton and log both reasons once."""
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    assert routes.cute_preferences(_with(arch=(9, 0))) == ["fa4", "sm90"]
    info = _with(arch=(9, 0), block_size=64, need_grad=True, need_lse=True)
    if BACKENDS["sm90"].support(info)[0]:  # the CuTe DSL is installed
        assert routes.select_routes(info)[1].name == "sm90"
    info = _with(arch=(9, 0), block_size=64, need_grad=True, need_lse=True, dtype=torch.float16)
    with caplog.at_level("WARNING", logger="fastvideo_cute"):
        assert select_route(info).name == "triton"
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "128-wide kv tiles" in text and ("the backward is bfloat16 only" in text or "CuTe DSL" in text), text


def test_sm100_64_token_kernels_only_by_name_until_verified(monkeypatch):
    info = _with(arch=(10, 0), block_size=64, need_grad=True, need_lse=True, q_len=4096, kv_len=4096)
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    if not BACKENDS["sm100"].verified_on((10, 0)):
        assert select_route(info).name == "triton"  # FA4 cannot serve 64-token tiles on sm_100
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm100")
    assert select_route(info).name == "sm100"


def test_triton_refuses_grid_past_its_limit(monkeypatch):
    ok, reason = BACKENDS["triton"].support(_with(batch=2, heads=40000))
    assert not ok and "grid limit 65535" in reason
    assert BACKENDS["triton"].support(_with(batch=1, heads=65535))[0]
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    with pytest.raises(RouteError, match="grid limit"):
        select_route(_with(batch=1, heads=70000))


def test_call_fields_follow_the_dataclass():
    assert routes.CALL_FIELDS == tuple(f.name for f in dataclasses.fields(CallInfo))


def test_the_traced_selection_is_a_dynamo_constant():
    import torch._dynamo.decorators as decorators

    probe = decorators.assume_constant_result(lambda: None)
    assert getattr(probe, "_dynamo_marked_constant", False)  # the attribute Dynamo reads
    assert routes._select_names_traced._dynamo_marked_constant is True
