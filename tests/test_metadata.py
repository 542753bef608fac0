import pytest
import torch

from fastvideo_cute.metadata import (expand_block_map, index_to_map, invert_indices, map_to_index,
                                     split_block_sizes)


def test_map_index_round_trip_and_sorted():
    torch.manual_seed(0)
    m = torch.rand(2, 3, 5, 7) > 0.5
    idx, num = map_to_index(m)
    assert idx.dtype == torch.int32 and num.dtype == torch.int32 and idx.is_contiguous()
    assert torch.equal(num, m.sum(-1).to(torch.int32))
    for b in range(2):
        for h in range(3):
            for i in range(5):
                n = int(num[b, h, i])
                expect = torch.nonzero(m[b, h, i]).flatten().tolist()
                assert idx[b, h, i, :n].tolist() == expect  # ascending, exactly the selected ones
    assert torch.equal(index_to_map(idx, num, 7), m)


def test_invert_indices_is_the_transpose():
    torch.manual_seed(1)
    m = torch.rand(1, 2, 6, 4) > 0.6
    m[0, 0, :, 2] = False  # a kv block nobody selects
    idx, num = map_to_index(m)
    kidx, knum = invert_indices(idx, num, 4)
    assert kidx.shape == (1, 2, 4, 6) and knum[0, 0, 2] == 0
    assert torch.equal(index_to_map(kidx, knum, 6), m.transpose(-2, -1))
    # k2q -> q2k again gives the original lists
    qidx, qnum = invert_indices(kidx, knum, 6)
    assert torch.equal(qnum, num)
    for i in range(6):
        n = int(num[0, 1, i])
        assert torch.equal(qidx[0, 1, i, :n], idx[0, 1, i, :n])


def test_map_to_index_matches_a_brute_force_construction():
    # An independent reference: per row, the selected columns ascending, then the others ascending.
    g = torch.Generator().manual_seed(4)
    m = torch.rand(2, 3, 17, 45, generator=g) > 0.7
    m[0, 0, 0] = False  # an empty row
    m[1, 2, 3] = True  # a full row
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    idx, num = map_to_index(m.to(dev))
    for b in range(2):
        for h in range(3):
            for r in range(17):
                row = m[b, h, r].tolist()
                sel = [j for j, x in enumerate(row) if x]
                assert num[b, h, r].item() == len(sel)
                assert idx[b, h, r].tolist() == sel + [j for j, x in enumerate(row) if not x]


def test_expansion_and_size_split():
    m = torch.tensor([[[[True, False], [False, True]]]])
    e = expand_block_map(m, 2, 4)
    assert e.shape == (1, 1, 4, 8)
    assert e[0, 0, 0].tolist() == [True] * 4 + [False] * 4
    assert e[0, 0, 3].tolist() == [False] * 4 + [True] * 4
    sizes = torch.tensor([128, 91, 37, 0, 64])
    assert split_block_sizes(sizes, 2, 64).tolist() == [64, 64, 64, 27, 37, 0, 0, 0, 64, 0]
    assert split_block_sizes(torch.tensor([256, 200, 129]), 4, 64).tolist() == [
        64, 64, 64, 64, 64, 64, 64, 8, 64, 64, 1, 0]
    # total valid tokens are preserved
    s = torch.randint(0, 257, (50,))
    assert split_block_sizes(s, 2, 128).sum() == s.sum()


@pytest.mark.parametrize("shape", [(2, 3, 7, 11), (1, 1, 1, 1), (4, 5), (3, 0), (2, 6, 256)])
def test_map_to_index_is_the_stable_sort_permutation(shape):
    """The sort-free build equals a stable sort on "not selected" (selected columns first, each
    group ascending), for random, empty and full rows."""
    gen = torch.Generator().manual_seed(sum(shape))
    m = torch.rand(shape, generator=gen) < 0.3
    if m.numel():
        m.view(-1, shape[-1])[0] = False
        if m.view(-1, shape[-1]).shape[0] > 1:
            m.view(-1, shape[-1])[1] = True
    idx, num = map_to_index(m)
    expect = torch.sort((~m).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
    assert idx.dtype == torch.int32 and num.dtype == torch.int32
    assert torch.equal(idx, expect)
    assert torch.equal(num, m.sum(-1, dtype=torch.int32))


def test_map_to_index_of_a_transposed_map_is_contiguous():
    """The backward builds k2q lists from the transposed map: the result must be contiguous."""
    m = torch.rand(2, 3, 9, 5, generator=torch.Generator().manual_seed(4)) < 0.4
    idx, num = map_to_index(m.transpose(-1, -2))
    assert idx.is_contiguous() and num.is_contiguous()
    expect = torch.sort((~m.transpose(-1, -2)).to(torch.uint8), dim=-1, stable=True).indices.to(torch.int32)
    assert torch.equal(idx, expect)


def test_block_sparsity_builds_each_form_once_and_consistently(monkeypatch):
    from fastvideo_cute import metadata
    from fastvideo_cute.metadata import BlockSparsity

    g = torch.Generator().manual_seed(0)
    block_map = torch.rand(2, 3, 4, 5, generator=g) < 0.4
    idx, num = map_to_index(block_map)
    from_lists = BlockSparsity(None, idx[..., :3].clone(), num.clamp(max=3), num_kv_blocks=5)
    want = torch.zeros_like(block_map)
    for b, h, i in torch.cartesian_prod(torch.arange(2), torch.arange(3), torch.arange(4)).tolist():
        for j in idx[b, h, i, :min(int(num[b, h, i]), 3)].tolist():
            want[b, h, i, j] = True
    calls = []
    real = metadata.index_to_map
    monkeypatch.setattr(metadata, "index_to_map", lambda *a: calls.append(1) or real(*a))
    assert torch.equal(from_lists.block_map(), want)
    assert torch.equal(from_lists.block_map(), want) and len(calls) == 1  # built once
    from_map = BlockSparsity.of(block_map)
    assert BlockSparsity.of(from_map) is from_map and not from_map.has_lists
    got_idx, got_num = from_map.q2k()
    assert got_idx.dtype == torch.int32 and torch.equal(got_idx, idx) and torch.equal(got_num, num)
    k_idx, k_num = from_map.k2q()
    assert torch.equal(k_num, block_map.sum(-2, dtype=torch.int32))
    assert torch.equal(k_idx, map_to_index(block_map.transpose(-2, -1))[0])
    with pytest.raises(ValueError, match="needs block_map or both"):
        BlockSparsity(None, idx, None, num_kv_blocks=5)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        BlockSparsity(None, idx, num)
