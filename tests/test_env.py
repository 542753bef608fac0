"""Route variables are parsed strictly and conflicts are errors (issue #11 item 8)."""

import pytest
import torch

from fastvideo_cute.call import CallInfo
from fastvideo_cute.env import env_flag, route_request
from fastvideo_cute.errors import EnvError, RouteError
from fastvideo_cute.routes import select_route

INFO = CallInfo("block_sparse", "cpu", None, torch.float32, 32, 64, False, q_len=128, kv_len=128)


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.parametrize("value,expected", [("1", True), ("TRUE", True), (" yes ", True), ("On", True),
                                            ("0", False), ("false", False), ("no", False), ("OFF", False),
                                            ("", False), ("  ", False)])
def test_flag_values(monkeypatch, value, expected):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", value)
    assert env_flag("FASTVIDEO_VSA_TRITON") is expected


@pytest.mark.parametrize("value", ["2", "enable", "y", "t", "tru"])
def test_other_flag_values_raise(monkeypatch, value):
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", value)
    with pytest.raises(EnvError, match=f"FASTVIDEO_VSA_CUTEDSL='{value}': expected one of"):
        select_route(INFO)


def test_triton_with_another_named_backend_is_an_error(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "fa4")
    with pytest.raises(EnvError, match="ask for different backends"):
        select_route(INFO)
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "triton")  # agreeing requests are fine
    assert select_route(INFO).name == "triton"


def test_cute_with_backend_triton_is_an_error(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "triton")
    with pytest.raises(EnvError, match="ask for different routes"):
        route_request()


def test_env_errors_are_route_errors_and_value_errors(monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    with pytest.raises(RouteError, match="both set"):
        select_route(INFO)
    with pytest.raises(ValueError):
        select_route(INFO)
