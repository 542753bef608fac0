"""Fused Triton ``map_to_index`` against the torch path (``metadata._map_to_index_torch``), exactly.

On CPU the kernel runs under TRITON_INTERPRET=1 (set by tests/conftest.py), called directly
through ``map_to_index_fused`` / ``map_to_index_triton`` (``metadata.map_to_index`` sends only
CUDA maps to it); shapes are small. The ``gpu`` tests check the dispatch in
``metadata.map_to_index`` on CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute import metadata  # noqa: E402
from fastvideo_cute.kernels.triton.map_to_index import (MAX_COLS, map_to_index_fused,  # noqa: E402
                                                        map_to_index_triton)
from fastvideo_cute.metadata import _map_to_index_torch, map_to_index  # noqa: E402


def _random_map(shape, density, seed):
    gen = torch.Generator().manual_seed(seed)
    m = torch.rand(shape, generator=gen) < density
    rows = m.view(-1, shape[-1]) if m.numel() else None
    if rows is not None and rows.shape[0] >= 3:
        rows[0] = False  # a row with nothing selected
        rows[-1] = True  # a row with everything selected
    return m


def _check(m):
    idx, num = map_to_index_fused(m)
    ref_idx, ref_num = _map_to_index_torch(m)
    assert idx.dtype == torch.int32 and num.dtype == torch.int32
    assert idx.is_contiguous() and num.is_contiguous()
    assert idx.shape == m.shape and num.shape == m.shape[:-1]
    assert torch.equal(idx, ref_idx)
    assert torch.equal(num, ref_num)
    return idx, num


@pytest.mark.parametrize("density", [0.0, 0.125, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("shape", [(1, 6, 16), (2, 3, 5, 7), (9, 13)])
def test_random_maps_match_torch(shape, density):
    """Leading dims (1,), (2, 3) and none; empty, sparse, dense and full maps."""
    _check(_random_map(shape, density, seed=len(shape) * 100 + int(density * 8)))


@pytest.mark.parametrize("cols", [1, 7, 65, 257])
def test_non_power_of_two_and_single_column(cols):
    m = _random_map((2, 5, cols), 0.3, seed=cols)
    idx, num = _check(m)
    # every row is a permutation of 0..C-1, the selected columns first
    assert torch.equal(idx.sort(dim=-1).values, torch.arange(cols, dtype=torch.int32).expand_as(idx))


def test_transposed_map():
    """The backward's k2q lists come from the transposed (strided) map."""
    m = _random_map((2, 3, 9, 5), 0.4, seed=4)
    t = m.transpose(-2, -1)
    assert not t.is_contiguous()
    _check(t)


def test_leading_dims_that_do_not_flatten_to_a_view():
    """Permuted leading dims (and a sliced last dim): the flatten copies; the result still matches."""
    m = _random_map((2, 3, 4, 10), 0.4, seed=5)
    _check(m.permute(1, 0, 2, 3))
    _check(m[..., 1:8])
    _check(m[:, :, :1].expand(2, 3, 4, 10))  # stride-0 rows


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.float32])
def test_non_bool_maps_read_as_nonzero(dtype):
    gen = torch.Generator().manual_seed(6)
    low = 0 if dtype == torch.uint8 else -2  # values other than 0/1, negatives where the dtype has them
    m = torch.randint(low, 3, (2, 4, 11), generator=gen).to(dtype)
    m.view(-1, 11)[0] = 0
    idx, num = _check(m)
    b_idx, b_num = map_to_index_fused(m != 0)
    assert torch.equal(idx, b_idx) and torch.equal(num, b_num)


@pytest.mark.parametrize("shape", [(2, 0, 5), (0, 3, 4), (3, 4, 0), (0, 0)])
def test_empty_maps(shape):
    """R == 0 (or no leading rows): empty outputs; C == 0: empty idx, num zeros; no launch."""
    m = torch.zeros(shape, dtype=torch.bool)
    idx, num = _check(m)
    if shape[-1] == 0:
        assert (num == 0).all()


def test_launch_helper_writes_into_the_outputs():
    m = _random_map((2, 3, 6), 0.5, seed=7)
    idx = torch.full((2, 3, 6), -7, dtype=torch.int32)
    num = torch.full((2, 3), -7, dtype=torch.int32)
    assert map_to_index_triton(m, idx, num) is None
    ref_idx, ref_num = _map_to_index_torch(m)
    assert torch.equal(idx, ref_idx) and torch.equal(num, ref_num)
    # C == 0 zeroes num
    num0 = torch.full((2, 3), -7, dtype=torch.int32)
    map_to_index_triton(torch.zeros(2, 3, 0, dtype=torch.bool), torch.empty(2, 3, 0, dtype=torch.int32), num0)
    assert (num0 == 0).all()


@pytest.mark.parametrize("arg, bad", [
    ("idx_out", torch.empty(2, 3, 5, dtype=torch.int32)),          # wrong shape
    ("idx_out", torch.empty(2, 3, 6, dtype=torch.int64)),          # wrong dtype
    ("idx_out", torch.empty(2, 6, 3, dtype=torch.int32).transpose(-2, -1)),  # not contiguous
    ("num_out", torch.empty(2, 3, 1, dtype=torch.int32)),          # wrong shape
    ("num_out", torch.empty(2, 3, dtype=torch.float32)),           # wrong dtype
])
def test_bad_outputs_raise(arg, bad):
    m = torch.zeros(2, 3, 6, dtype=torch.bool)
    outs = {"idx_out": torch.empty(2, 3, 6, dtype=torch.int32), "num_out": torch.empty(2, 3, dtype=torch.int32)}
    outs[arg] = bad
    with pytest.raises(ValueError, match=arg):
        map_to_index_triton(m, **outs)


def test_bad_maps_raise():
    with pytest.raises(ValueError, match="block_map"):
        map_to_index_fused(torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="block_map"):
        map_to_index_triton(torch.zeros(1, MAX_COLS + 1, dtype=torch.bool),
                            torch.empty(1, MAX_COLS + 1, dtype=torch.int32), torch.empty(1, dtype=torch.int32))


def test_cpu_maps_take_the_torch_path(monkeypatch):
    """``map_to_index`` sends only CUDA maps to the kernel."""
    monkeypatch.setattr(metadata, "_fused_map_to_index", lambda: pytest.fail("fused path on a CPU map"))
    m = _random_map((2, 4, 9), 0.5, seed=8)
    idx, num = map_to_index(m)
    ref_idx, ref_num = _map_to_index_torch(m)
    assert torch.equal(idx, ref_idx) and torch.equal(num, ref_num)


# ----------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("transposed", [False, True])
def test_gpu_map_to_index_dispatches_to_the_fused_kernel(transposed):
    """[1, 12, 256, 256] at 87.5 % sparsity (and its transpose): ``map_to_index`` on CUDA runs the
    fused kernel and equals the torch path exactly."""
    assert metadata._fused_map_to_index() is not None, "Triton not importable: no fused path"
    gen = torch.Generator().manual_seed(9)
    m = (torch.rand(1, 12, 256, 256, generator=gen) < 0.125).cuda()
    m[0, 0, 0] = False
    m[0, 0, 1] = True
    if transposed:
        m = m.transpose(-2, -1)
    calls = []
    fused, limit = metadata._fused_map_to_index()

    def spy(x):
        calls.append(x.shape)
        return fused(x)

    metadata._FUSED = (spy, limit)
    try:
        idx, num = map_to_index(m)
    finally:
        metadata._FUSED = (fused, limit)
    assert calls == [m.shape]
    ref_idx, ref_num = _map_to_index_torch(m)
    assert idx.is_cuda and idx.is_contiguous() and num.is_contiguous()
    assert idx.dtype == torch.int32 and num.dtype == torch.int32
    assert torch.equal(idx, ref_idx) and torch.equal(num, ref_num)
    assert torch.equal(num.cpu(), m.cpu().sum(-1, dtype=torch.int32))


@pytest.mark.parametrize("config", [(1, 1), (2, 1), (4, 2), (8, 4)], ids=lambda c: f"rows{c[0]}w{c[1]}")
def test_every_launch_config_writes_the_same_lists(config):
    """The benchmark's sweep configs (rows per program, warps): 2 x 3 x 7 = 42 rows, not a
    multiple of 4 or 8 (the last program's extra rows are masked), 37 columns."""
    m = _random_map((2, 3, 7, 37), 0.3, seed=11)
    idx = torch.empty(m.shape, dtype=torch.int32)
    num = torch.empty(m.shape[:-1], dtype=torch.int32)
    map_to_index_triton(m, idx, num, config=config)
    ref_idx, ref_num = _map_to_index_torch(m)
    assert torch.equal(idx, ref_idx) and torch.equal(num, ref_num)
