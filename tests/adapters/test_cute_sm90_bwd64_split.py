"""CPU checks of the experimental split backward's host side (``adapters/cute_sm90_bwd64_split``):
the pair slots against a Python walk of the lists (q-owned order: q items in order, each q block's
kv blocks ascending), with ragged counts, empty rows and columns, B and H > 1."""

import pytest
import torch

from fastvideo_cute.adapters.cute_sm90_bwd64_split import DS_TILE_ELEMS, head_chunks, pair_chunks, pair_slots
from fastvideo_cute.metadata import index_to_map, invert_indices, map_to_index


@pytest.mark.parametrize("b, h, n, p, seed", [(1, 1, 5, 0.5, 0), (2, 3, 9, 0.4, 1), (1, 2, 16, 0.125, 2),
                                                (2, 1, 7, 0.0, 3), (1, 1, 6, 1.0, 4)])
def test_pair_slots_number_the_pairs_in_q_owned_order(b, h, n, p, seed):
    gen = torch.Generator().manual_seed(seed)
    block_map = torch.rand(b, h, n, n, generator=gen) < p
    block_map[..., 0, :] = False  # an empty q row
    qidx, qnum = map_to_index(block_map)
    kidx, knum = invert_indices(qidx, qnum, n)
    assert torch.equal(index_to_map(qidx, qnum, n), block_map)
    qoff, slots = pair_slots(qidx, qnum, kidx, n)
    walk, c = {}, 0
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                assert int(qoff.view(b, h, n)[bi, hi, i]) == c
                for s in range(int(qnum[bi, hi, i])):
                    walk[(bi, hi, i, int(qidx[bi, hi, i, s]))] = c
                    c += 1
    assert c == int(block_map.sum())
    slots = slots.view(b, h, n, -1)
    seen = []
    for bi in range(b):
        for hi in range(h):
            for j in range(n):
                for t in range(int(knum[bi, hi, j])):
                    seen.append(int(slots[bi, hi, j, t]))
                    assert seen[-1] == walk[(bi, hi, int(kidx[bi, hi, j, t]), j)]
                for t in range(int(knum[bi, hi, j]), slots.shape[-1]):  # never read; in range
                    assert 0 <= int(slots[bi, hi, j, t]) <= max(c - 1, 0) or c == 0
    assert sorted(seen) == list(range(c))  # every pair exactly once
    assert qoff.dtype == torch.int32 and slots.dtype == torch.int32


@pytest.mark.parametrize("pairs, heads, cap, want", [
    (10, 5, 10 * 8192 * 2, [(0, 2), (2, 4), (4, 5)]),
    (10, 3, 1, [(0, 1), (1, 2), (2, 3)]),  # one sequence a chunk at least
    (10, 3, 1 << 40, [(0, 3)]),
])
def test_head_chunks_fit_the_cap(pairs, heads, cap, want):
    got = head_chunks(pairs, heads, cap)
    assert got == want
    assert all(max(1, cap // (pairs * DS_TILE_ELEMS * 2)) >= h1 - h0 for h0, h1 in got)


@pytest.mark.parametrize("pairs, cap, want", [
    ([3, 3, 3, 3], 6, [(0, 2), (2, 4)]),
    ([3, 3, 3, 3], 5, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    ([1, 4, 1, 1, 9, 0], 6, [(0, 3), (3, 4), (4, 5), (5, 6)]),  # 9 alone over the cap: its own chunk
    ([0, 0, 0], 1, [(0, 3)]),
    ([5], 100, [(0, 1)]),
])
def test_pair_chunks_fit_exact_counts_in_the_cap(pairs, cap, want):
    """Consecutive ranges whose summed tiles fit the cap, greedily, one sequence at least."""
    tile = DS_TILE_ELEMS * 2
    got = pair_chunks(pairs, cap * tile)
    assert got == want
    assert [h for c in got for h in range(*c)] == list(range(len(pairs)))


def test_the_split_main_kernel_is_the_routes_build_with_ds_out():
    from fastvideo_cute.adapters.cute_sm90_bwd64_split import SPLIT_MAIN_CONFIG
    from fastvideo_cute.backends.sm90_backend import _BWD_WS_CONFIG

    assert SPLIT_MAIN_CONFIG == {**_BWD_WS_CONFIG, "ds_out": True, "grouped": False, "ds_evict_first": True}


def _cpu_call(**bad):
    """The split's arguments on CPU (nb = 4, W = 2), with ``bad`` replacing some."""
    b, h, nb = 1, 2, 4
    x = torch.zeros(b, h, nb * 64, 128, dtype=torch.bfloat16)
    args = dict(q=x, k=x, v=x, out=x, dout=x, lse=torch.zeros(b, h, nb * 64),
                q2k_idx=torch.zeros(b, h, nb, 2, dtype=torch.int32), q2k_num=torch.zeros(b, h, nb, dtype=torch.int32),
                k2q_idx=torch.zeros(b, h, nb, 2, dtype=torch.int32), k2q_num=torch.zeros(b, h, nb, dtype=torch.int32),
                kv_block_sizes=torch.full((nb,), 64, dtype=torch.int32))
    args.update(bad)
    return args


@pytest.mark.parametrize("bad, match", [
    (dict(q2k_idx=torch.zeros(1, 2, 4, 2)), "q2k_idx must be an integer tensor"),
    (dict(q2k_num=torch.zeros(1, 2, 3, dtype=torch.int32)), "q2k_num"),
    (dict(q2k_idx=torch.zeros(1, 2, 4, 0, dtype=torch.int32)), "q2k_idx"),
    ({}, "CUDA"),  # the route's checks follow: CPU tensors are refused by name
])
def test_bad_input_is_refused_before_any_launch(bad, match):
    from fastvideo_cute.adapters.cute_sm90_bwd64_split import sm90_block_sparse_bwd64_split, sm90_bwd64_split_support

    args = _cpu_call(**bad)
    ok, reason = sm90_bwd64_split_support(**args)
    assert not ok and match in reason, reason
    with pytest.raises(ValueError, match=f"sm90_block_sparse_bwd64_split: .*{match}"):
        sm90_block_sparse_bwd64_split(**args)


@pytest.mark.parametrize("q_groups", [0, -512, True, 2.0, "two"])
def test_bad_q_groups_is_refused_by_name(q_groups):
    from fastvideo_cute.adapters.cute_sm90_bwd64_split import sm90_block_sparse_bwd64_split

    with pytest.raises(ValueError, match="q_groups must be None, 'auto' or a positive int"):
        sm90_block_sparse_bwd64_split(**_cpu_call(), q_groups=q_groups)
