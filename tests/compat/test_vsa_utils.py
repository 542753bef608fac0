"""compat vsa_utils against FastVideo's semantics, written out as brute-force loops here (a
3x5x7 grid with 2x2x2 tiles: partial tiles along every dim), plus dtypes, caching and the
metadata bundle."""

import itertools
import math

import pytest
import torch

from fastvideo_cute.compat.fastvideo_kernel import vsa_utils as vu

GRID, TILE = (3, 5, 7), (2, 2, 2)


def _tiles(grid, tile):
    """(origin, extent) of every tile, raster over the tile grid."""
    counts = [math.ceil(g / t) for g, t in zip(grid, tile)]
    for a, b, c in itertools.product(*(range(n) for n in counts)):
        origin = (a * tile[0], b * tile[1], c * tile[2])
        yield origin, tuple(min(t, g - o) for t, g, o in zip(tile, grid, origin))


def _brute_partition(grid, tile):
    T, H, W = grid
    out = []
    for (t0, h0, w0), (et, eh, ew) in _tiles(grid, tile):
        for i, j, k in itertools.product(range(et), range(eh), range(ew)):
            out.append(((t0 + i) * H + (h0 + j)) * W + (w0 + k))
    return out


def test_tile_partition_indices_match_brute_force():
    idx = vu.get_tile_partition_indices(GRID, TILE, "cpu")
    assert idx.dtype == torch.int64 and idx.tolist() == _brute_partition(GRID, TILE)
    rev = vu.get_reverse_tile_partition_indices(GRID, TILE, "cpu")
    assert rev.dtype == torch.int64
    assert torch.equal(rev[idx], torch.arange(math.prod(GRID))) and torch.equal(idx[rev], torch.arange(105))
    # the identity case and a 4x4x4 tiling of a grid that does not divide
    assert vu.get_tile_partition_indices((2, 2, 2), (2, 2, 2), "cpu").tolist() == list(range(8))
    assert vu.get_tile_partition_indices((5, 7, 3), (4, 4, 4), "cpu").tolist() == _brute_partition((5, 7, 3),
                                                                                                   (4, 4, 4))


def test_variable_block_sizes_match_brute_force():
    counts = tuple(math.ceil(g / t) for g, t in zip(GRID, TILE))
    sizes = vu.construct_variable_block_sizes(GRID, counts, "cpu", TILE)
    assert sizes.dtype == torch.int32
    assert sizes.tolist() == [math.prod(e) for _, e in _tiles(GRID, TILE)]
    assert int(sizes.sum()) == math.prod(GRID)
    default = vu.construct_variable_block_sizes((9, 10, 7), (3, 3, 2), "cpu")  # default tile (4, 4, 4)
    assert default.tolist() == [math.prod(e) for _, e in _tiles((9, 10, 7), (4, 4, 4))]
    with pytest.raises(ValueError, match=r"num_tiles must be ceil\(dit_seq_shape / tile_size\) = \(2, 3, 4\)"):
        vu.construct_variable_block_sizes(GRID, (2, 3, 5), "cpu", TILE)


def test_non_pad_index_matches_brute_force():
    sizes = torch.tensor([3, 0, 8, 5], dtype=torch.int32)
    want = [b * 8 + s for b, n in enumerate(sizes.tolist()) for s in range(n)]
    got = vu.get_non_pad_index(sizes, 8)
    assert got.dtype == torch.int64 and got.tolist() == want
    assert torch.equal(vu.get_non_pad_index(torch.tensor([64, 64]), 64), torch.arange(128))


def test_getters_are_cached_and_take_lists():
    a = vu.get_tile_partition_indices(GRID, TILE, torch.device("cpu"))
    b = vu.get_tile_partition_indices(list(GRID), list(TILE), "cpu")
    assert a is b  # FastVideo's lru_cache hands back the same tensor
    s1 = vu.construct_variable_block_sizes(GRID, (2, 3, 4), "cpu", TILE)
    assert s1 is vu.construct_variable_block_sizes(GRID, (2, 3, 4), "cpu", TILE)


def test_built_under_inference_mode_are_normal_tensors():
    with torch.inference_mode():
        sizes = vu.construct_variable_block_sizes((6, 5, 4), (2, 2, 1), "cpu")
        idx = vu.get_tile_partition_indices((6, 5, 4), (4, 4, 4), "cpu")
    assert not sizes.is_inference() and not idx.is_inference()


def test_build_vsa_metadata_bundle():
    shape, tile = (9, 10, 7), (4, 4, 4)
    meta = vu.build_vsa_metadata(shape, tile, device="cpu")
    assert set(meta) == {"tile_partition_indices", "reverse_tile_partition_indices", "variable_block_sizes",
                         "non_pad_index", "num_tiles", "max_block_size"}
    assert meta["num_tiles"] == (3, 3, 2) and meta["max_block_size"] == 64
    assert meta["tile_partition_indices"].tolist() == _brute_partition(shape, tile)
    sizes = meta["variable_block_sizes"]
    assert meta["non_pad_index"].tolist() == [b * 64 + s for b, n in enumerate(sizes.tolist()) for s in range(n)]
    assert vu.build_vsa_metadata((4, 8, 8), (4, 8, 8), device="cpu")["max_block_size"] == 256
    assert vu.VSA_TILE_SIZE == (4, 4, 4)
    with pytest.raises(ValueError, match="holds 8 tokens"):
        vu.build_vsa_metadata(GRID, TILE, device="cpu")
