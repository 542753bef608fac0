"""The VSA rule (routes.select_vsa_routes) on synthetic sm_90 calls (no GPU needed): gated
inference on sm_90 with 64-token blocks takes the sm90 backend (its epilogue fuses the gate);
everything else, and any named or forced route, is select_routes' answer."""

import dataclasses
import importlib.util

import pytest
import torch

from fastvideo_cute import routes
from fastvideo_cute.backends import BACKENDS
from fastvideo_cute.routes import CallInfo, RouteError, select_routes, select_vsa_route_name, select_vsa_routes

# What video_sparse_attn asks on the H200 at Wan-1.3B: 64-token tiles, partial kv tiles, no LSE.
BASE = CallInfo("block_sparse", "cuda", (9, 0), torch.bfloat16, 128, 64, False, batch=1, heads=12, q_len=32768,
                kv_len=32768, need_lse=False, kv_all_full=False)

needs_cute = pytest.mark.skipif(importlib.util.find_spec("cutlass") is None, reason="the CuTe DSL is not installed")


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    # Without the route table, so that what the rule does is seen alone: the shipped table also
    # ranks sm90 first for the 64-token forward classes (tests/backends/test_sm90_backend.py), which
    # would pick it for these calls' forward whatever the rule says.
    monkeypatch.setenv("FASTVIDEO_VSA_ROUTE_TABLE", "off")
    monkeypatch.setattr(routes, "_LOGGED", set())


def _with(**kw):
    return dataclasses.replace(BASE, **kw)


def _names(pair):
    return pair[0].name + routes.ROUTE_SEP + pair[1].name


def _outcome(select, *args):
    """The route name, or the RouteError's message (CPU tensors on a GPU box: Triton refuses)."""
    try:
        result = select(*args)
    except RouteError as exc:
        return f"RouteError: {exc}"
    return result if isinstance(result, str) else _names(result)


@needs_cute
@pytest.mark.parametrize("table", ["off", "shipped"])
def test_gated_inference_on_sm90_takes_sm90(monkeypatch, table):
    if table == "off":
        monkeypatch.setenv("FASTVIDEO_VSA_ROUTE_TABLE", "off")
    else:
        monkeypatch.delenv("FASTVIDEO_VSA_ROUTE_TABLE", raising=False)
    for info in (BASE, _with(kv_all_full=True), _with(bshd=True), _with(head_dim=64, dtype=torch.float16),
                 _with(block_size=128), _with(block_size=256)):  # 128/256: split into 64-token tiles
        assert select_vsa_route_name(info, True) == "sm90|sm90"
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")  # asking for CuTe does not change it
    assert select_vsa_route_name(BASE, True) == "sm90|sm90"


@pytest.mark.parametrize("change", [
    dict(need_grad=True),  # training: the gated rule is for inference (the table routes training)
    dict(block_size=128, need_grad=True),
    dict(arch=(10, 0)),
    dict(arch=(12, 1), block_size=128, kv_all_full=True),
    dict(dtype=torch.float32),
    dict(head_dim=32),
    dict(device_type="cpu", arch=None),
])
def test_other_calls_take_select_routes(change):
    info = _with(**change)
    got = _outcome(select_vsa_route_name, info, True)
    assert got == _outcome(select_routes, info)
    assert "sm90|" not in got


def test_without_a_gate_the_rule_does_not_apply():
    assert select_vsa_route_name(BASE, False) == _names(select_routes(BASE))
    assert "sm90" not in select_vsa_route_name(BASE, False)


def test_forced_triton_wins(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    assert select_vsa_route_name(BASE, True) == "triton|triton"


@pytest.mark.parametrize("name", ["triton", "cudnn", "fa4"])
def test_a_named_backend_wins(monkeypatch, name):
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", name)
    backend = BACKENDS[name]
    if backend.support(BASE)[0]:
        assert select_vsa_route_name(BASE, True) == f"{name}|{name}"
    else:  # not installed here: the forced-route error, never a silent sm90
        with pytest.raises(RouteError, match=f"FASTVIDEO_VSA_BACKEND={name} cannot serve this call"):
            select_vsa_route_name(BASE, True)


def test_sm90_named_on_a_training_call_it_cannot_serve_raises_with_the_reason(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "sm90")
    with pytest.raises(RouteError, match="FASTVIDEO_VSA_BACKEND=sm90 cannot serve this call: the backward is "
                                         "bfloat16 only"):
        select_vsa_route_name(_with(need_grad=True, dtype=torch.float16), True)
    with pytest.raises(RouteError, match="the backward serves 64-token blocks only, got 128"):
        select_vsa_route_name(_with(need_grad=True, block_size=128), True)


def test_conflicting_variables_still_raise(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    with pytest.raises(RouteError, match="both set"):
        select_vsa_route_name(BASE, True)


def test_an_unverified_arch_or_an_unsupported_call_falls_back(monkeypatch):
    be = BACKENDS["sm90"]
    monkeypatch.setattr(be, "verified_on", lambda arch: False)
    assert select_vsa_route_name(BASE, True) == _names(select_routes(BASE))
    monkeypatch.setattr(be, "verified_on", lambda arch: True)
    monkeypatch.setattr(be, "support", lambda info: (False, "no"))
    assert select_vsa_route_name(BASE, True) == _names(select_routes(BASE))


@needs_cute
def test_the_rule_reads_a_fake_sm90_device(monkeypatch):
    """The API's path: call_info on (CPU) tensors whose device is made to look like an H200."""
    from fastvideo_cute.call import call_info

    monkeypatch.setattr("fastvideo_cute.call.arch_of", lambda device: (9, 0))
    q = torch.empty(1, 2, 256, 128, dtype=torch.bfloat16)
    info = dataclasses.replace(call_info(q, q, 64, False, False, False, None), device_type="cuda")
    assert info.arch == (9, 0)
    assert select_vsa_route_name(info, True) == "sm90|sm90"
    assert "sm90" not in select_vsa_route_name(dataclasses.replace(info, need_grad=True), True)


def test_the_traced_vsa_selection_is_a_dynamo_constant():
    assert routes._select_vsa_names_traced._dynamo_marked_constant is True
    fields = [getattr(BASE, name) for name in routes.CALL_FIELDS]
    assert routes._select_vsa_names_traced(True, *fields) == select_vsa_route_name(BASE, True)
    assert routes._select_vsa_names_traced(False, *fields) == select_vsa_route_name(BASE, False)


def test_select_vsa_routes_returns_backends():
    fwd, bwd = select_vsa_routes(_with(need_grad=True), True)
    assert fwd.name != "sm90" and bwd.name != "sm90"
