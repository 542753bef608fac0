"""Backends' support predicates on synthetic calls (no GPU needed): each limit refuses with its reason."""

import dataclasses

import pytest
import torch

from fastvideo_cute.backends import BACKENDS
from fastvideo_cute.call import CallInfo

BASE = CallInfo("block_sparse", "cuda", (12, 1), torch.bfloat16, 128, 128, False, batch=1, heads=12,
                q_len=32768, kv_len=32768, need_lse=False, kv_all_full=True)


def _with(**kw):
    return dataclasses.replace(BASE, **kw)


def test_fa4_on_sm120_says_why(monkeypatch):
    ok, reason = BACKENDS["fa4"].support(_with(need_lse=True))
    assert not ok and "sm_90" in reason and "sm_100" in reason


@pytest.mark.parametrize("change,words", [
    (dict(block_size=128), "64-token blocks only"),
    (dict(arch=(9, 0)), "targets compute capability 10.0"),
    (dict(arch=(10, 3)), "targets compute capability 10.0"),  # the backward is sm_100a only (seed 000)
    (dict(q_len=64 * 63, kv_len=64 * 63), "even number of 64-token blocks"),
    (dict(dtype=torch.float16), "bfloat16 only"),
    (dict(kv_len=8192), "q_len == kv_len"),
])
def test_sm100_support_refuses_with_reason(change, words):
    info = _with(**{**dict(arch=(10, 0), block_size=64, need_grad=True, need_lse=True, q_len=4096,
                           kv_len=4096), **change})
    ok, reason = BACKENDS["sm100"].support(info)
    assert not ok and words in reason


def test_sm100_forward_alone_also_serves_sm103():
    ok, _ = BACKENDS["sm100"].support(_with(arch=(10, 3), block_size=64, need_grad=False, q_len=4096, kv_len=4096))
    assert ok


@pytest.mark.parametrize("change,words", [
    (dict(device_type="cpu", arch=None), "needs CUDA tensors"),
    (dict(arch=(8, 0)), "this GPU is sm_80"),
    (dict(need_grad=True, head_dim=96), "SM90 backward requires head_dim 128"),
    (dict(need_grad=True, dtype=torch.float16), "bfloat16"),
    (dict(head_dim=32), "head"),
])
def test_cudnn_support_refuses_with_reason(change, words):
    info = _with(**{**dict(arch=(9, 0), block_size=64, need_lse=True, kv_all_full=True), **change})
    ok, reason = BACKENDS["cudnn"].support(info)
    assert not ok and words in reason, reason


def test_cudnn_serves_the_sm90_forward_with_partial_tiles_when_installed():
    import importlib.util

    info = _with(arch=(9, 0), block_size=64, need_lse=True, kv_all_full=False)
    ok, reason = BACKENDS["cudnn"].support(info)
    if importlib.util.find_spec("cudnn") is None:
        assert not ok and "fastvideo-cute[cudnn]" in reason
    else:
        assert ok, reason


def test_forced_cudnn_that_cannot_serve_raises(monkeypatch):
    from fastvideo_cute.errors import RouteError
    from fastvideo_cute.routes import select_route

    monkeypatch.setenv("FASTVIDEO_VSA_BACKEND", "cudnn")
    with pytest.raises(RouteError, match="FASTVIDEO_VSA_BACKEND=cudnn cannot serve this call: cuDNN BSA needs CUDA"):
        select_route(_with(device_type="cpu", arch=None))


def test_cudnn_backward_compile_key_names_its_q_grouping():
    """The warm-up keys cuDNN's backward on one q group vs several (its blk128 kernel compiles a
    variant for each): one group up to the adapter's bound on sm_90 (cudnn_bwd_bucket), else by
    cuDNN's default group size."""
    be = BACKENDS["cudnn"]

    def groups(arch, block, q_len):
        call = dataclasses.replace(BASE, arch=arch, block_size=block, need_grad=True, q_len=q_len, kv_len=q_len)
        return dict(be.compile_keys(call)["bwd"].detail)["q_groups"]

    assert groups((9, 0), 128, 39424) == "1"  # 308 q blocks: the adapter's one group
    assert groups((9, 0), 128, 65536) == "several"
    assert groups((10, 0), 128, 39424) == "several"  # cuDNN's default there: groups of 256
    assert groups((10, 0), 128, 256 * 128) == "1"
    assert groups((9, 0), 64, 32768) == "1" and groups((9, 0), 64, 39936) == "several"
    assert "bwd" not in be.compile_keys(dataclasses.replace(BASE, arch=(9, 0), need_grad=False))
