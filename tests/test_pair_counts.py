"""fastvideo_cute.pair_counts on CPU: the counts are the per-sequence sums of the lists' counts, tied
to the very map tensor they were started for (not an equal one), void once the map changes in
place, dropped when the map dies; inference tensors get none. (On CUDA the same entries hold a pinned
copy and an event: tests/backends/test_sm90_backward_chains_gpu.py runs that path.)"""

import gc

import torch

from fastvideo_cute import pair_counts as pc
from fastvideo_cute.metadata import map_to_index


def _map():
    m = torch.zeros(2, 3, 5, 5, dtype=torch.bool)
    m[0, :, :, 0] = True
    m[1, 2] = True
    m[1, 0, 4, 3] = True
    return m


def test_counts_are_the_per_sequence_pair_sums_of_the_map_they_were_started_for():
    m = _map()
    assert pc.pair_counts(m) is None
    assert pc.start_pair_counts(m, map_to_index(m)[1])
    assert pc.pair_counts(m) == [5, 5, 5, 1, 0, 25] == m.reshape(6, -1).sum(-1).tolist()
    assert pc.pair_counts(m.clone()) is None  # equal values, another tensor
    assert pc.pair_counts(m[:1]) is None  # a view is another tensor too
    # [H, Qb] counts (a map shared by the batch): one count per head
    shared = m[1]
    assert pc.start_pair_counts(shared, map_to_index(shared)[1])
    assert pc.pair_counts(shared) == [1, 0, 25]


def test_an_in_place_change_voids_the_counts_and_a_new_start_renews_them():
    m = _map()
    pc.start_pair_counts(m, map_to_index(m)[1])
    m[0, 0, 0, 1] = True
    assert pc.pair_counts(m) is None
    pc.start_pair_counts(m, map_to_index(m)[1])
    assert pc.pair_counts(m)[0] == 6


def test_the_entry_dies_with_its_map():
    m = _map()
    pc.start_pair_counts(m, map_to_index(m)[1])
    key = id(m)
    assert key in pc._PENDING
    del m
    gc.collect()
    assert key not in pc._PENDING


def test_inference_tensors_get_no_counts():
    with torch.inference_mode():
        m = _map()
        num = map_to_index(m)[1]
    assert not pc.start_pair_counts(m, num) and pc.pair_counts(m) is None
