"""CPU tests of the Hopper 64-token backward's host side: the q groups of the warp-specialized
chain (``cute_sm90_bwd64_ws.group_bounds``) against a plain Python model, and the argument checks
that come before any GPU work. The kernels themselves: tests/kernels/cute/test_block_sparse_bwd64_sm90_*."""

import pytest
import torch

from fastvideo_cute.adapters import cute_sm90_bwd64 as A
from fastvideo_cute.adapters.cute_sm90_bwd64_ws import (GROUP_BLOCKS_DEFAULT, GROUP_MIN_BLOCKS, H100_PAIR_MIN_BLOCKS,
                                                     default_groups, group_bounds, run_ws_chain)


def _lists(items, nb, max_q, seed):
    g = torch.Generator().manual_seed(seed)
    num = torch.randint(0, max_q + 1, (items,), generator=g, dtype=torch.int32)
    idx = torch.stack([torch.randperm(nb, generator=g)[:max_q] for _ in range(items)]).to(torch.int32)
    return idx, num


@pytest.mark.parametrize("nb, group, seed", [(20, 6, 0), (17, 4, 1), (9, 1, 2), (64, 7, 3)])
def test_group_bounds_split_lists_by_q_range(nb, group, seed):
    idx, num = _lists(11, nb, min(nb, 9), seed)
    ordered, gb = group_bounds(idx, num, nb, group)
    groups = -(-nb // group)
    assert gb.dtype == torch.int32 and gb.shape == (11, groups + 1) and ordered.dtype == torch.int32
    for i in range(11):
        n = int(num[i])
        assert int(gb[i, 0]) == 0 and int(gb[i, -1]) == n
        for g in range(groups):  # each group's entries, in the order the caller's list has them
            part = ordered[i, gb[i, g]:gb[i, g + 1]].tolist()
            assert part == [q for q in idx[i, :n].tolist() if g * group <= q < (g + 1) * group]


def test_group_bounds_keep_ascending_lists_ascending():
    idx, num = _lists(6, 40, 12, 7)
    idx = idx.sort(dim=1).values
    ordered, gb = group_bounds(idx, num, 40, 9)
    for i in range(6):
        n = int(num[i])
        assert ordered[i, :n].tolist() == sorted(idx[i, :n].tolist())


def test_one_group_keeps_the_lists_as_given():
    idx, num = _lists(5, 30, 8, 4)
    for args in ((30, None), (30, 30), (30, 64), (30, 4, 31)):  # no size, size >= nb, nb below min_blocks
        ordered, gb = group_bounds(idx, num, *args)
        assert torch.equal(ordered, idx)
        assert torch.equal(gb, torch.stack([torch.zeros_like(num), num], dim=1))


def test_default_groups_start_at_the_measured_size():
    idx, num = _lists(3, GROUP_MIN_BLOCKS, 8, 5)
    assert group_bounds(idx, num, GROUP_MIN_BLOCKS - 1, 384, GROUP_MIN_BLOCKS)[1].shape[1] == 2
    assert group_bounds(idx, num, GROUP_MIN_BLOCKS, 384, GROUP_MIN_BLOCKS)[1].shape[1] == 3


@pytest.mark.parametrize("name", ["NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA GH200 480GB"])
def test_each_gpu_gets_its_measured_groups(name):
    """Two equal groups on an H100 from H100_PAIR_MIN_BLOCKS up to GROUP_MIN_BLOCKS (the Wan-1.3B
    grid's 624 blocks: 312 + 312), one group below; from GROUP_MIN_BLOCKS on, and on every other
    GPU, groups of GROUP_BLOCKS_DEFAULT. The split those sizes give, by group_bounds."""
    h100 = "H100" in name
    for nb in (512, H100_PAIR_MIN_BLOCKS - 2, H100_PAIR_MIN_BLOCKS, 624, 701, GROUP_MIN_BLOCKS, 1024):
        size, min_blocks = default_groups(nb, name)
        paired = h100 and H100_PAIR_MIN_BLOCKS <= nb < GROUP_MIN_BLOCKS
        assert (size, min_blocks) == (((nb + 1) // 2, 0) if paired else (GROUP_BLOCKS_DEFAULT, GROUP_MIN_BLOCKS))
        idx, num = _lists(3, nb, 8, nb)
        groups = group_bounds(idx, num, nb, size, min_blocks)[1].shape[1] - 1
        assert groups == (2 if paired else 1 if nb < GROUP_MIN_BLOCKS else -(-nb // GROUP_BLOCKS_DEFAULT)), nb


def test_bad_group_size_is_refused():
    idx, num = _lists(2, 10, 4, 6)
    with pytest.raises(ValueError, match="group_blocks"):
        group_bounds(idx, num, 10, 0)


def test_bad_main_and_order_are_refused_before_any_work():
    x = torch.zeros(1, 1, 64, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="main must be one of"):
        A.sm90_block_sparse_bwd64(x, x, x, x, x, None, None, None, None, main="fast")
    with pytest.raises(ValueError, match="main must be one of"):
        A.compiled_sm90_main(main="fast")
    with pytest.raises(ValueError, match="order_policy"):
        run_ws_chain(None, x, x, x, x, x, None, None, None, None, 1.0, order_policy="random")
