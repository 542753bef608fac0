"""Fused Triton k2q lists against the torch path (``metadata._map_to_index_torch`` of the
transposed map): the same ``num`` and the same first ``num`` entries of every row.

On CPU the kernel runs under TRITON_INTERPRET=1 (set by tests/conftest.py), called directly
through ``k2q_lists_fused`` / ``k2q_lists_triton`` (``BlockSparsity.k2q`` sends only CUDA maps to
it); shapes are small. The ``gpu`` test checks the dispatch in ``BlockSparsity.k2q`` on CUDA.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute import metadata  # noqa: E402
from fastvideo_cute.kernels.triton.k2q_lists import k2q_lists_fused, k2q_lists_triton  # noqa: E402
from fastvideo_cute.metadata import BlockSparsity, _map_to_index_torch, map_to_index  # noqa: E402

SENTINEL = -7  # what the outputs hold before a launch: slots past num must keep it


def _random_map(shape, density, seed):
    gen = torch.Generator().manual_seed(seed)
    m = torch.rand(shape, generator=gen) < density
    if m.numel() and m.shape[-1] >= 3 and 0 < density < 1:
        cols = m.view(-1, *m.shape[-2:])
        cols[0, :, 0] = False  # a column with nothing selected
        cols[-1, :, -1] = True  # a column with everything selected
    return m


def _check(m, **config):
    """Run the launch helper into sentinel-filled outputs; compare with the reference and
    check that nothing past ``num`` was written."""
    *lead, rows, cols = m.shape
    idx = torch.full((*lead, cols, rows), SENTINEL, dtype=torch.int32)
    num = torch.full((*lead, cols), SENTINEL, dtype=torch.int32)
    assert k2q_lists_triton(m, idx, num, **config) is None
    ref_idx, ref_num = _map_to_index_torch(m.transpose(-2, -1))
    assert torch.equal(num, ref_num)
    used = torch.arange(rows) < num.unsqueeze(-1)
    assert torch.equal(torch.where(used, idx, SENTINEL), torch.where(used, ref_idx, SENTINEL))
    assert bool((idx[~used] == SENTINEL).all()), "a slot past num was written"
    return idx, num


@pytest.mark.parametrize("density", [0.0, 0.125, 1.0])
@pytest.mark.parametrize("shape", [(70, 45), (1, 33, 70), (2, 2, 67, 40)],
                         ids=["no-lead", "lead1", "lead2"])
def test_random_maps_match_torch(shape, density):
    """Leading dims none, (1,) and (2, 2); R and C not multiples of the tile (64 x 32), R > 64
    (two row chunks) and C > 32 (two column blocks); empty, sparse and full maps."""
    _check(_random_map(shape, density, seed=len(shape) * 100 + int(density * 8)))


@pytest.mark.parametrize("shape", [(3, 9, 1), (3, 1, 9), (1, 1), (2, 1, 40)], ids=["C1", "R1", "R1C1", "R1-wide"])
def test_single_row_or_column(shape):
    _check(_random_map(shape, 0.5, seed=sum(shape)))


@pytest.mark.parametrize("dtype", [torch.int8, torch.float32, torch.uint8, torch.int32, torch.float16])
def test_non_bool_maps_read_as_nonzero(dtype):
    gen = torch.Generator().manual_seed(6)
    low = 0 if dtype == torch.uint8 else -2  # values other than 0/1, negatives where the dtype has them
    m = torch.randint(low, 3, (2, 19, 37), generator=gen).to(dtype)
    m[0, :, 0] = 0
    idx, num = k2q_lists_fused(m)
    b_idx, b_num = _check(m != 0)
    assert torch.equal(num, b_num)
    used = torch.arange(19) < num.unsqueeze(-1)
    assert torch.equal(idx[used], b_idx[used])
    _check(m)


def test_transposed_map():
    """A non-contiguous map (the transpose of a contiguous one): read through its strides."""
    m = _random_map((2, 3, 41, 70), 0.3, seed=4).transpose(-2, -1)
    assert not m.is_contiguous()
    _check(m)


def test_leading_dims_that_do_not_flatten_to_a_view():
    m = _random_map((2, 3, 20, 10), 0.4, seed=5)
    _check(m.permute(1, 0, 2, 3))
    _check(m[..., 1:8])
    _check(m[:, :, :1].expand(2, 3, 20, 10))  # stride-0 rows


@pytest.mark.parametrize("shape", [(2, 0, 5), (0, 3, 4), (3, 4, 0), (0, 0), (2, 0, 0)])
def test_empty_maps(shape):
    """No leading rows or C == 0: empty num, nothing launched; R == 0: num zeros, empty idx."""
    m = torch.zeros(shape, dtype=torch.bool)
    idx, num = k2q_lists_fused(m)
    *lead, rows, cols = shape
    assert idx.shape == (*lead, cols, rows) and num.shape == (*lead, cols)
    assert idx.dtype == num.dtype == torch.int32
    if rows == 0:
        assert bool((num == 0).all())
    _check(m)


def test_allocating_form():
    m = _random_map((2, 3, 30, 20), 0.25, seed=7)
    idx, num = k2q_lists_fused(m)
    assert idx.dtype == torch.int32 and num.dtype == torch.int32
    assert idx.is_contiguous() and num.is_contiguous()
    assert idx.shape == (2, 3, 20, 30) and num.shape == (2, 3, 20)
    ref_idx, ref_num = _map_to_index_torch(m.transpose(-2, -1))
    used = torch.arange(30) < num.unsqueeze(-1)
    assert torch.equal(num, ref_num) and torch.equal(idx[used], ref_idx[used])


@pytest.mark.parametrize("config", [dict(block_c=c, block_r=r, num_warps=w)
                                    for c, r, w in ((16, 16, 1), (64, 32, 4), (32, 128, 8), (128, 64, 2))],
                         ids=lambda c: f"c{c['block_c']}r{c['block_r']}w{c['num_warps']}")
def test_every_launch_config_writes_the_same_lists(config):
    """The sweep's knobs: 2 x 3 x 37 columns (not a multiple of any block), 150 rows."""
    _check(_random_map((2, 3, 150, 37), 0.3, seed=11), **config)


@pytest.mark.parametrize("arg, bad", [
    ("idx_out", torch.empty(2, 3, 5, 6, dtype=torch.int32)),         # [..., R, C], not [..., C, R]
    ("idx_out", torch.empty(2, 3, 6, 5, dtype=torch.int64)),         # wrong dtype
    ("idx_out", torch.empty(2, 3, 5, 6, dtype=torch.int32).transpose(-2, -1)),  # not contiguous
    ("num_out", torch.empty(2, 3, 5, dtype=torch.int32)),            # [..., R], not [..., C]
    ("num_out", torch.empty(2, 3, 6, dtype=torch.float32)),          # wrong dtype
    ("num_out", torch.empty(2, 6, dtype=torch.int32)[:, None].expand(2, 3, 6)),  # not contiguous
])
def test_bad_outputs_raise(arg, bad):
    m = torch.zeros(2, 3, 5, 6, dtype=torch.bool)
    outs = {"idx_out": torch.empty(2, 3, 6, 5, dtype=torch.int32), "num_out": torch.empty(2, 3, 6, dtype=torch.int32)}
    outs[arg] = bad
    with pytest.raises(ValueError, match=arg):
        k2q_lists_triton(m, **outs)


def test_bad_maps_and_configs_raise():
    with pytest.raises(ValueError, match="block_map"):
        k2q_lists_fused(torch.zeros(5, dtype=torch.bool))
    with pytest.raises(ValueError, match="block_map"):
        k2q_lists_triton(torch.zeros(5, dtype=torch.bool), torch.empty(5, dtype=torch.int32),
                         torch.empty(5, dtype=torch.int32))
    m = torch.zeros(4, 6, dtype=torch.bool)
    outs = dict(idx_out=torch.empty(6, 4, dtype=torch.int32), num_out=torch.empty(6, dtype=torch.int32))
    for name, value in (("block_c", 24), ("block_r", 0), ("num_warps", 0)):
        with pytest.raises(ValueError, match=name):
            k2q_lists_triton(m, **outs, **{name: value})


def test_cpu_k2q_is_unchanged(monkeypatch):
    """``BlockSparsity.k2q`` on a CPU map (or lists) takes ``map_to_index`` of the transposed map,
    whole rows included, and never the fused kernel."""
    monkeypatch.setattr(metadata, "_fused_k2q_lists", lambda: pytest.fail("fused k2q on a CPU map"))
    m = _random_map((2, 4, 9, 11), 0.4, seed=8)
    want = _map_to_index_torch(m.transpose(-2, -1))
    for sparsity in (BlockSparsity.of(m), BlockSparsity(None, *map_to_index(m), num_kv_blocks=11)):
        idx, num = sparsity.k2q()
        assert torch.equal(idx, want[0]) and torch.equal(num, want[1])
    with pytest.raises(TypeError, match="block_map"):  # map_to_index's check, as before
        BlockSparsity.of(m.float()).k2q()


# ----------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_k2q_dispatches_to_the_fused_kernel(monkeypatch):
    """[1, 12, 300, 300] at 12.5 %: ``BlockSparsity.k2q`` on CUDA runs the fused kernel; its
    counts and first ``num`` entries equal the torch path's."""
    fused = metadata._fused_k2q_lists()
    assert fused is not None, "Triton not importable: no fused path"
    calls = []
    monkeypatch.setattr(metadata, "FUSED_K2Q", True)  # the default; set so the test holds if it is turned off
    monkeypatch.setattr(metadata, "_K2Q", lambda x: calls.append(x.shape) or fused(x))
    gen = torch.Generator().manual_seed(9)
    m = (torch.rand(1, 12, 300, 300, generator=gen) < 0.125).cuda()
    idx, num = BlockSparsity.of(m).k2q()
    assert calls == [m.shape]
    assert idx.is_cuda and idx.is_contiguous() and num.is_contiguous()
    ref_idx, ref_num = _map_to_index_torch(m.transpose(-2, -1))
    used = torch.arange(300, device="cuda") < num.unsqueeze(-1)
    assert torch.equal(num, ref_num) and torch.equal(idx[used], ref_idx[used])
