"""cuDNN BSA support predicate, pins, import laziness and padding plan, on CPU (no cuDNN needed).

Every limit of ``cudnn_support`` is checked to refuse with its reason, and a served neighbour of
it to pass, so a limit that is dropped or loosened fails here. The limits themselves are those of
``nvidia-cudnn-frontend==1.32.0`` (cited in ``adapters/cudnn_bsa_support.py``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastvideo_cute.adapters import cudnn_bsa as C
from fastvideo_cute.adapters.cudnn_bsa_support import CUDNN_PHYSICAL_TILE, cudnn_arch_int, cudnn_support

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
SM90, SM100, SM103, SM110, SM120, SM121 = (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)


def support(arch, dtype=BF16, d=128, block=128, grad=False, q_len=None, kv_len=None, heads_q=4, heads_kv=4,
            full=False):
    q_len = 4 * block if q_len is None else q_len
    kv_len = 6 * block if kv_len is None else kv_len
    return cudnn_support(arch, dtype, d, block, grad, q_len=q_len, kv_len=kv_len, heads_q=heads_q,
                         heads_kv=heads_kv, bshd=True, kv_all_full=full)


def refused(verdict, *words):
    ok, reason = verdict
    assert not ok, "expected a refusal"
    for w in words:
        assert w in reason, f"{w!r} not in {reason!r}"
    return reason


def served(verdict):
    ok, reason = verdict
    assert ok and reason == "", reason


def test_arch_int():
    assert cudnn_arch_int((9, 0)) == 90 and cudnn_arch_int((10, 3)) == 103 and cudnn_arch_int((12, 1)) == 121
    assert cudnn_arch_int(100) == 100 and cudnn_arch_int(9) == 90 and cudnn_arch_int(None) is None


def test_physical_tiles_match_the_triton_backend_rule():
    from fastvideo_cute.backends.triton_backend import PHYSICAL_TILES

    assert {blk: (t, t) for blk, t in CUDNN_PHYSICAL_TILE.items()} == PHYSICAL_TILES


@pytest.mark.parametrize("arch", [None, (8, 0), (8, 9), (13, 0)])
def test_unserved_archs(arch):
    refused(support(arch), "cuDNN BSA")


@pytest.mark.parametrize("arch", [SM90, SM100, SM103, SM110, SM120, SM121])
@pytest.mark.parametrize("block", [64, 128, 256])
def test_forward_bf16_d128_served_everywhere(arch, block):
    served(support(arch, block=block))


def test_library_conditions():
    refused(support(SM90, block=96), "logical block size")
    refused(support(SM90, block=128, q_len=100), "multiples")
    refused(support(SM90, block=128, kv_len=0), "multiples")
    refused(support(SM90, heads_q=8, heads_kv=2), "GQA")
    refused(support(SM90, dtype=FP32), "float16/bfloat16")


def test_sm90_forward_limits():
    for d in (64, 96, 128):
        served(support(SM90, dtype=FP16, d=d, block=64))
        served(support(SM90, dtype=BF16, d=d, block=256))
    refused(support(SM90, d=32), "SM90 forward", "64, 96 or 128")
    refused(support(SM90, d=256, block=64), "SM90 forward")


def test_sm100_forward_limits():
    for arch in (SM100, SM103, SM110):
        served(support(arch, dtype=FP16, d=96, block=128))
        served(support(arch, dtype=FP16, d=64, block=256))
        served(support(arch, dtype=BF16, d=128, block=64))
        refused(support(arch, dtype=FP16, d=128, block=64), "blk64 forward", "bfloat16")
        refused(support(arch, dtype=BF16, d=64, block=64), "blk64 forward", "head_dim 128")
        refused(support(arch, d=32, block=128), "blk128 forward", "64, 96 or 128")


def test_sm120_forward_limits():
    for arch in (SM120, SM121):
        served(support(arch, dtype=FP16, d=128, block=64))
        refused(support(arch, d=64), "SM120 forward", "head_dim 128")
        refused(support(arch, d=96, block=64), "SM120 forward")


def test_backward_limits():
    refused(support(SM120, grad=True), "no backward on SM120")
    refused(support(SM121, grad=True, block=64), "no backward on SM120")
    for arch in (SM90, SM100, SM110):
        refused(support(arch, dtype=FP16, grad=True, full=True), "backward requires bfloat16")
    served(support(SM90, grad=True, block=64, full=True))
    served(support(SM90, grad=True, block=128, full=True))
    served(support(SM90, grad=True, block=256, full=True))
    for block in (64, 128, 256):  # partial kv blocks: served (re-measured on the H200, docs/backends/cudnn.md)
        served(support(SM90, grad=True, block=block))
    refused(support(SM90, d=64, grad=True, block=128), "SM90 backward requires head_dim 128")
    refused(support(SM90, d=96, grad=True, block=64), "SM90 backward")
    served(support(SM100, d=64, grad=True, block=128, full=True))
    served(support(SM100, d=64, grad=True, block=256, full=True))
    # blk64 with head_dim 64: refused by the blk64 forward already (cuDNN's blk64 backward has the same limit)
    refused(support(SM100, d=64, grad=True, block=64), "blk64 forward")
    refused(support(SM100, d=96, grad=True, block=128), "blk128 backward requires head_dim 64 or 128")
    # the forward alone is still served for what the backward refuses
    served(support(SM100, d=96, grad=False, block=128))


def test_block_sizes_in_the_sm110_blk128_backward():
    """cuDNN: "SM{arch} blk128 backward does not yet support block_sizes" except on sm_100/sm_103."""
    for arch in (SM100, SM103):
        served(support(arch, grad=True, block=128, full=True))
        served(support(arch, grad=True, block=256, full=False))  # sm_100/sm_103 blk128 backward takes block_sizes
    for block in (128, 256):
        refused(support(SM110, grad=True, block=block, full=False), "does not yet support block_sizes")
        served(support(SM110, grad=True, block=block, full=True))
    served(support(SM110, grad=True, block=64, full=False))  # the blk64 backward takes block_sizes
    served(support(SM110, grad=False, block=128, full=False))  # the forward takes them


def test_q_len_differs_from_kv_len_and_edge_limit():
    served(support(SM90, block=64, grad=True, q_len=64, kv_len=64 * 17, full=True))
    served(support(SM90, block=128, grad=True, q_len=128 * 9, kv_len=128, full=True))
    tile = 64
    big = tile * 50000  # 50000 x 50000 edges > int32
    refused(support(SM90, block=64, grad=True, q_len=big, kv_len=big, full=True), "int32")
    served(support(SM90, block=64, grad=False, q_len=big, kv_len=big))


def test_padding_plan():
    assert C.padding_plan(all_full=True, need_backward=True) == ()
    assert C.padding_plan(all_full=True, need_backward=False) == ()
    assert C.padding_plan(all_full=False, need_backward=False) == ("v",)
    assert C.padding_plan(all_full=False, need_backward=True) == ("k", "v")
    assert C.padding_plan(all_full=False, need_backward=True, padding_finite=True) == ()


def test_pins_and_version_problems(monkeypatch):
    assert C.CUDNN_PINS == {"nvidia-cudnn-frontend": "1.32.0"}
    versions = {"nvidia-cudnn-frontend": "1.32.0", "nvidia-cutlass-dsl": "4.8.1"}
    monkeypatch.setattr(C, "_installed", lambda name: versions.get(name))
    assert C.cudnn_version_problems() == []
    versions["nvidia-cudnn-frontend"] = "1.31.0"
    versions["nvidia-cutlass-dsl"] = "4.7.9"
    probs = C.cudnn_version_problems()
    assert "nvidia-cudnn-frontend: installed 1.31.0, pinned 1.32.0" in probs
    assert "nvidia-cutlass-dsl: installed 4.7.9, needs >= 4.8.0" in probs
    versions.clear()
    assert len(C.cudnn_version_problems()) == 2


def test_load_cudnn_raises_import_error_with_the_fix(monkeypatch):
    monkeypatch.setattr(C, "_installed", lambda name: None)
    C.load_cudnn.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"pip install 'fastvideo-cute\[cudnn\]'"):
            C.load_cudnn()
    finally:
        C.load_cudnn.cache_clear()


def test_importing_the_adapter_does_not_import_cudnn_or_triton():
    root = Path(__file__).resolve().parents[2]
    code = ("import sys; import fastvideo_cute.adapters.cudnn_bsa as c, fastvideo_cute.adapters.cudnn_bsa_metadata, "
            "fastvideo_cute.adapters.cudnn_bsa_support; "
            "print(sorted(m for m in sys.modules if m == 'cudnn' or m.startswith(('cudnn.', 'cutlass', 'triton'))))")
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_unsupported_call_raises_before_any_launch():
    q = torch.zeros(1, 128, 2, 128, dtype=BF16)
    idx = torch.zeros(1, 2, 1, 1, dtype=torch.int32)
    num = torch.zeros(1, 2, 1, dtype=torch.int32)
    sizes = torch.full((1,), 128, dtype=torch.int32)
    with pytest.raises(C.CudnnUnsupportedError, match="CUDA tensors"):
        C.cudnn_block_sparse_fwd(q, q, q, idx, num, sizes, block_size=128, bshd=True, softmax_scale=None,
                                 all_full=True)
    with pytest.raises(ValueError, match="k and v must have one shape"):
        C.cudnn_block_sparse_fwd(q, q, q[:, :64], idx, num, sizes, block_size=128, bshd=True, softmax_scale=None,
                                 all_full=True)


def test_backward_bucket_is_one_group_only_where_measured_faster():
    """sm_90: one q group up to the measured bound (blk64: 512 q blocks, blk128: 384), cuDNN's
    default past it and on every other arch."""
    from fastvideo_cute.adapters.cudnn_bsa_support import ONE_GROUP_MAX_Q_BLOCKS, cudnn_bwd_bucket

    assert ONE_GROUP_MAX_Q_BLOCKS == {64: 512, 128: 384}
    assert cudnn_bwd_bucket((9, 0), 64, 32768) == 512  # 512 q blocks
    assert cudnn_bwd_bucket((9, 0), 64, 32768 + 64) is None
    assert cudnn_bwd_bucket((9, 0), 64, 39936) is None  # the Wan-1.3B grid at 64: 624 q blocks
    assert cudnn_bwd_bucket((9, 0), 128, 39424) == 384  # the grid at 128: 308
    assert cudnn_bwd_bucket((9, 0), 128, 43008) == 384  # the grid at 256 as 128-token tiles: 336
    assert cudnn_bwd_bucket((9, 0), 128, 384 * 128) == 384
    assert cudnn_bwd_bucket((9, 0), 128, 65536) is None
    for arch in ((10, 0), (12, 1), None):
        assert cudnn_bwd_bucket(arch, 64, 4096) is None and cudnn_bwd_bucket(arch, 128, 4096) is None
    assert cudnn_bwd_bucket((9, 0), 256, 4096) is None  # not a physical tile
