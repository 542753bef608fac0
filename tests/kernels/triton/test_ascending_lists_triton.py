"""Triton ``ascending_lists_triton`` against the torch path (``api_indices.ascending_rows_torch``),
exactly. On CPU the kernel runs under TRITON_INTERPRET=1 (set by tests/conftest.py), called
directly; shapes are small. Rows cover num = 0, num = W, partial counts, widths that are and are
not powers of two, several rows per program, and non-int32 / strided inputs."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from fastvideo_cute.api_indices import ascending_rows_torch  # noqa: E402
from fastvideo_cute.kernels.triton.ascending_lists import MAX_WIDTH, ascending_lists_triton  # noqa: E402


def _lists(lead, width, kv_blocks, seed, dtype=torch.int32):
    gen = torch.Generator().manual_seed(seed)
    rows = int(torch.tensor(lead).prod()) if lead else 1
    # distinct entries per row (a random permutation's head), counts in [0, width]
    idx = torch.stack([torch.randperm(kv_blocks, generator=gen)[:width] for _ in range(rows)])
    num = torch.randint(0, width + 1, (rows,), generator=gen)
    num[0], num[-1] = 0, width
    # slots past num hold junk, as FastVideo's -1 fill or stale values would
    junk = torch.arange(width)[None, :] >= num[:, None]
    idx = torch.where(junk, torch.full_like(idx, -1), idx)
    return idx.reshape(*lead, width).to(dtype), num.reshape(*lead).to(dtype)


@pytest.mark.parametrize("lead,width,kv_blocks", [((2, 3, 5), 4, 9), ((1, 2, 7), 13, 20), ((3, 40), 64, 70),
                                                  ((2, 9), 17, 17), ((5,), 1, 3)])
def test_rows_equal_the_torch_sort(lead, width, kv_blocks):
    idx, num = _lists(lead, width, kv_blocks, seed=width)
    out = ascending_lists_triton(idx, num, kv_blocks)
    ref = ascending_rows_torch(idx, num, kv_blocks)
    assert out.dtype == torch.int32 and out.is_contiguous() and out.shape == idx.shape
    assert torch.equal(out, ref)
    # the used entries are ascending and the rest 0, stated without the reference
    for row, n in zip(out.reshape(-1, width), num.reshape(-1).tolist()):
        assert torch.all(row[1:n] > row[:n - 1]) if n > 1 else True
        assert torch.all(row[n:] == 0)


def test_int64_and_strided_inputs():
    idx, num = _lists((2, 6), 8, 30, seed=3, dtype=torch.int64)
    wide = torch.zeros(2, 6, 16, dtype=torch.int64)
    wide[..., ::2] = idx  # every other slot: a non-unit stride along the row
    out = ascending_lists_triton(wide[..., ::2], num, 30)
    assert torch.equal(out, ascending_rows_torch(idx, num, 30))


def test_bad_arguments_are_named():
    idx, num = _lists((2, 3), 4, 9, seed=0)
    with pytest.raises(ValueError, match="num must have"):
        ascending_lists_triton(idx, num[:1], 9)
    with pytest.raises(ValueError, match="wide"):
        ascending_lists_triton(torch.zeros(1, MAX_WIDTH + 1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), 9)


def test_writes_into_a_given_out():
    idx, num = _lists((2, 3), 4, 9, seed=2)
    out = torch.full(idx.shape, 7, dtype=torch.int32)
    assert ascending_lists_triton(idx, num, 9, out=out) is out
    assert torch.equal(out, ascending_rows_torch(idx, num, 9))
    with pytest.raises(ValueError, match="out must be int32"):
        ascending_lists_triton(idx, num, 9, out=torch.empty(idx.shape, dtype=torch.int64))


def test_empty_rows():
    out = ascending_lists_triton(torch.zeros(0, 4, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 9)
    assert out.shape == (0, 4)


@pytest.mark.gpu
def test_on_cuda_and_through_the_index_api(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import fastvideo_cute as fvc
    from fastvideo_cute import api_indices

    idx, num = _lists((2, 12, 512), 64, 512, seed=1)
    idx, num = idx.cuda(), num.cuda()
    assert torch.equal(ascending_lists_triton(idx, num, 512), ascending_rows_torch(idx, num, 512))
    monkeypatch.setattr(api_indices, "TRITON_SORT", True)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    sel = torch.rand(1, 2, 64, 64, device="cuda", generator=g).topk(8, dim=-1).indices
    bm = torch.zeros(1, 2, 64, 64, dtype=torch.bool, device="cuda").scatter_(-1, sel, True)
    sizes = torch.full((64,), 64, dtype=torch.int32, device="cuda")
    n8 = torch.full((1, 2, 64), 8, dtype=torch.int32, device="cuda")
    o_map = fvc.block_sparse_attn(q, k, v, bm, sizes)
    o_lists = fvc.block_sparse_attn_from_indices(q, k, v, sel.to(torch.int32), n8, sizes)
    assert torch.equal(o_map[0], o_lists[0]) and torch.equal(o_map[1], o_lists[1])
