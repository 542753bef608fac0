"""Fused FA4 block-sparse lists (``kernels/triton/fa4_lists.py``) against the torch path of
``adapters/fa4_metadata.py``, bit for bit: forward (q-owned) and backward (kv-owned) lists, FULL
and PARTIAL tiles, every FA4 plan (64/128/256 on sm_90 and sm_100), ragged sizes incl. empty kv
blocks, an expanded batch, the all-full shortcut. On CPU the kernel runs under TRITON_INTERPRET=1
(tests/conftest.py); the GPU test checks that CUDA maps take the fused path."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.adapters import fa4_metadata as FM  # noqa: E402
from fastvideo_cute.adapters.fa4_plan import fa4_bwd_plan, fa4_fwd_plan  # noqa: E402

HAS_CUDA = torch.cuda.is_available()


def _case(b, h, n, block, seed, ragged=True, expand=False):
    gen = torch.Generator().manual_seed(seed)
    m = torch.rand(1 if expand else b, h, n, n, generator=gen) < 0.4
    m[..., 0, :] = False  # a q block with nothing selected
    m[..., -1, :] = True  # and one with everything
    if expand:
        m = m.expand(b, -1, -1, -1)
    sizes = torch.full((n,), block, dtype=torch.int32)
    if ragged:
        sizes[1] = 0  # an empty kv block
        sizes[-1] = block // 2 + 3  # partial: for 256 it spans two 128-tiles, one full
        if n > 3:
            sizes[2] = 1
    return m, sizes


def _torch_path(m, sizes, plan, all_full, transpose):
    full, part, ts = FM._physical_maps(m, sizes, plan, all_full)
    if transpose:
        full, part = full.transpose(-2, -1), None if part is None else part.transpose(-2, -1)
    return FM._index(full, part, (plan.q_sparse, plan.kv_tile)), ts


@pytest.mark.parametrize("arch", [(9, 0), (10, 0)])
@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("ragged,expand", [(True, False), (False, False), (True, True)])
def test_fused_lists_equal_the_torch_path(arch, block, transpose, ragged, expand):
    try:
        plan = (fa4_bwd_plan if transpose else fa4_fwd_plan)(arch, block)
    except Exception as e:  # a (arch, block, direction) FA4 does not serve
        pytest.skip(str(e))
    m, sizes = _case(2, 3, 5, block, seed=block + 7 * transpose, ragged=ragged, expand=expand)
    for all_full in ((False, True) if not ragged else (False,)):
        got = FM.fused_lists(m, sizes, plan, all_full, transpose)
        (want, want_ts) = _torch_path(m, sizes, plan, all_full, transpose)
        assert got is not None
        assert torch.equal(got.kv_tile_sizes, want_ts)
        for name in ("full_cnt", "full_idx", "mask_cnt", "mask_idx"):
            g, w = getattr(got.index, name), getattr(want, name)
            assert g.dtype == torch.int32 and g.is_contiguous() and g.shape == w.shape, name
            assert torch.equal(g, w), name
        assert got.index.block_size == want.block_size


def test_cpu_maps_take_the_torch_path(monkeypatch):
    monkeypatch.setattr(FM, "fused_lists", lambda *a, **k: pytest.fail("fused path on a CPU map"))
    m, sizes = _case(1, 2, 4, 128, seed=3)
    meta = FM.build_fwd_metadata(m, sizes, fa4_fwd_plan((9, 0), 128))
    assert int(meta.index.mask_cnt.sum()) > 0


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("block", [64, 128, 256])
def test_gpu_metadata_builders_take_the_fused_path(monkeypatch, block):
    calls = []
    real = FM.fused_lists
    monkeypatch.setattr(FM, "fused_lists", lambda *a: calls.append(a[-1]) or real(*a))
    m, sizes = _case(1, 12, 40, block, seed=block)
    for build, planner, transpose in ((FM.build_fwd_metadata, fa4_fwd_plan, False),
                                      (FM.build_bwd_metadata, fa4_bwd_plan, True)):
        try:
            plan = planner((9, 0), block)
        except Exception:
            continue
        got = build(m.cuda(), sizes.cuda(), plan)
        want, want_ts = _torch_path(m, sizes, plan, False, transpose)
        assert torch.equal(got.kv_tile_sizes.cpu(), want_ts)
        for name in ("full_cnt", "full_idx", "mask_cnt", "mask_idx"):
            assert torch.equal(getattr(got.index, name).cpu(), getattr(want, name)), name
    assert calls and all(isinstance(c, bool) for c in calls)
