"""Tests for fastvideo_cute.tiling (CPU, small grids, brute-force python references)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from fastvideo_cute.tiling import (
    from_tiles,
    padded_length,
    tile_counts,
    tile_gather_index,
    tile_scatter_index,
    to_tiles,
    variable_block_sizes,
)

TILES = [(4, 4, 4), (2, 8, 8), (4, 8, 8)]
GRIDS = [
    (5, 9, 7),  # non-divisible everywhere
    (3, 17, 10),
    (8, 16, 16),  # divisible by every tile
    (4, 8, 8),  # exactly one (4, 8, 8) tile
    (1, 1, 1),
    (2, 3, 20),  # tile larger than the grid in some dims
]
CASES = [(g, t) for g in GRIDS for t in TILES]
IDS = [f"grid{g}-tile{t}" for g, t in CASES]


# ----------------------------------------------------------------------------- brute force


def brute_layout(grid, tile):
    """Pure-python construction: (list of per-tile token lists in in-tile order, sizes)."""
    T, H, W = grid
    tt, th, tw = tile
    nt, nh, nw = (math.ceil(T / tt), math.ceil(H / th), math.ceil(W / tw))
    tiles = []
    for a in range(nt):
        for b in range(nh):
            for c in range(nw):
                toks = []
                for t in range(a * tt, min((a + 1) * tt, T)):
                    for h in range(b * th, min((b + 1) * th, H)):
                        for w in range(c * tw, min((c + 1) * tw, W)):
                            toks.append((t * H + h) * W + w)
                tiles.append(toks)
    return tiles


def brute_sizes(grid, tile):
    """Count tokens per tile by looping over tokens (independent of the layout builder)."""
    T, H, W = grid
    tt, th, tw = tile
    nt, nh, nw = (math.ceil(T / tt), math.ceil(H / th), math.ceil(W / tw))
    counts = [0] * (nt * nh * nw)
    for t, h, w in itertools.product(range(T), range(H), range(W)):
        counts[((t // tt) * nh + h // th) * nw + w // tw] += 1
    return counts


# ----------------------------------------------------------------------------- shapes / sizes


@pytest.mark.parametrize("grid,tile", CASES, ids=IDS)
def test_counts_and_length(grid, tile):
    n = tile_counts(grid, tile)
    assert n == tuple(math.ceil(g / t) for g, t in zip(grid, tile))
    assert all(isinstance(v, int) for v in n)
    assert padded_length(grid, tile) == math.prod(n) * math.prod(tile)


@pytest.mark.parametrize("grid,tile", CASES, ids=IDS)
def test_variable_block_sizes(grid, tile):
    sizes = variable_block_sizes(grid, tile)
    assert sizes.dtype == torch.int32
    assert sizes.shape == (math.prod(tile_counts(grid, tile)),)
    assert sizes.tolist() == brute_sizes(grid, tile)
    assert int(sizes.sum()) == math.prod(grid)
    assert int(sizes.min()) >= 1 and int(sizes.max()) <= math.prod(tile)


# ----------------------------------------------------------------------------- indices


@pytest.mark.parametrize("grid,tile", CASES, ids=IDS)
def test_gather_matches_brute_force(grid, tile):
    """In-tile order and valid-first placement match the python construction exactly."""
    P = math.prod(tile)
    expected = []
    for toks in brute_layout(grid, tile):
        expected += toks + [-1] * (P - len(toks))
    gather = tile_gather_index(grid, tile)
    assert gather.dtype == torch.int64
    assert gather.shape == (padded_length(grid, tile),)
    assert gather.tolist() == expected


@pytest.mark.parametrize("grid,tile", CASES, ids=IDS)
def test_valid_first_within_tile(grid, tile):
    P = math.prod(tile)
    gather = tile_gather_index(grid, tile).view(-1, P)
    sizes = variable_block_sizes(grid, tile).long()
    slot = torch.arange(P)
    expected_valid = slot[None, :] < sizes[:, None]
    assert torch.equal(gather >= 0, expected_valid)
    # Valid tokens of a tile appear in increasing raster order.
    for row, s in zip(gather.tolist(), sizes.tolist()):
        assert row[:s] == sorted(row[:s])


@pytest.mark.parametrize("grid,tile", CASES, ids=IDS)
def test_gather_scatter_inverse(grid, tile):
    n = math.prod(grid)
    gather = tile_gather_index(grid, tile)
    scatter = tile_scatter_index(grid, tile)
    assert scatter.dtype == torch.int64 and scatter.shape == (n,)
    # scatter is injective into [0, padded_length)
    assert int(scatter.min()) >= 0 and int(scatter.max()) < padded_length(grid, tile)
    assert scatter.unique().numel() == n
    assert torch.equal(gather[scatter], torch.arange(n))
    valid = (gather >= 0).nonzero().squeeze(1)
    assert valid.numel() == n
    assert torch.equal(scatter[gather[valid]], valid)
    # Each raster token appears exactly once among valid slots.
    assert torch.equal(gather[valid].sort().values, torch.arange(n))


def test_getters_return_fresh_copies():
    grid, tile = (5, 9, 7), (4, 4, 4)
    for fn in (variable_block_sizes, tile_gather_index, tile_scatter_index):
        a = fn(grid, tile)
        ref = a.clone()
        a.fill_(123)
        assert torch.equal(fn(grid, tile), ref), fn.__name__


def test_device_and_grid_spellings():
    a = tile_gather_index((5, 9, 7), (4, 4, 4))
    b = tile_gather_index([5, 9, 7], torch.Size([4, 4, 4]), device="cpu")
    c = tile_gather_index(torch.tensor([5, 9, 7]), (4, 4, 4), device=torch.device("cpu"))
    assert a.device.type == "cpu"
    assert torch.equal(a, b) and torch.equal(a, c)


def test_built_under_inference_mode_usable_with_autograd():
    grid, tile = (3, 5, 6), (2, 4, 4)  # a shape used nowhere else, so the cache is cold
    with torch.inference_mode():
        to_tiles(torch.randn(1, math.prod(grid), 2), grid, tile, dim=1)
    x = torch.randn(1, math.prod(grid), 2, requires_grad=True)
    from_tiles(to_tiles(x, grid, tile, dim=1), grid, tile, dim=1).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


# ----------------------------------------------------------------------------- to/from tiles


@pytest.mark.parametrize("grid,tile", CASES, ids=IDS)
@pytest.mark.parametrize("layout", ["bshd", "bhsd", "s", "sd_neg"])
def test_round_trip_and_padding(grid, tile, layout):
    n = math.prod(grid)
    L = padded_length(grid, tile)
    g = torch.Generator().manual_seed(0)
    if layout == "bshd":
        x, dim = torch.randn(2, n, 3, 4, generator=g), 1
    elif layout == "bhsd":
        x, dim = torch.randn(2, 3, n, 4, generator=g), 2
    elif layout == "s":
        x, dim = torch.randn(n, generator=g), 0
    else:
        x, dim = torch.randn(n, 5, generator=g), -2
    xt = to_tiles(x, grid, tile, dim)
    d = dim % x.dim()
    assert xt.shape == x.shape[:d] + (L,) + x.shape[d + 1 :]
    assert torch.equal(from_tiles(xt, grid, tile, dim), x)

    gather = tile_gather_index(grid, tile)
    valid = gather >= 0
    # Valid slots hold the right tokens, padding slots are exactly zero.
    assert torch.equal(xt.index_select(d, valid.nonzero().squeeze(1)), x.index_select(d, gather[valid]))
    pad = xt.index_select(d, (~valid).nonzero().squeeze(1))
    assert torch.equal(pad, torch.zeros_like(pad))


def test_to_tiles_values_token_ids():
    """Feed token ids through and compare against the brute-force layout."""
    grid, tile = (3, 17, 10), (2, 8, 8)
    n = math.prod(grid)
    x = torch.arange(n, dtype=torch.float64) + 1  # +1 so padding (0) is distinguishable
    xt = to_tiles(x, grid, tile, 0).long() - 1
    expected = []
    for toks in brute_layout(grid, tile):
        expected += toks + [-1] * (math.prod(tile) - len(toks))
    assert xt.tolist() == expected


def test_from_tiles_ignores_padding_contents():
    grid, tile = (5, 9, 7), (4, 4, 4)
    x = torch.randn(1, math.prod(grid), 2)
    xt = to_tiles(x, grid, tile, 1)
    pad = tile_gather_index(grid, tile) < 0
    xt[:, pad] = float("nan")
    assert torch.equal(from_tiles(xt, grid, tile, 1), x)


def test_outputs_are_new_tensors():
    grid, tile = (2, 8, 8), (2, 8, 8)  # identity layout: still must not alias
    x = torch.randn(1, 128, 2)
    xt = to_tiles(x, grid, tile, 1)
    assert torch.equal(xt, x) and xt.data_ptr() != x.data_ptr()
    y = from_tiles(xt, grid, tile, 1)
    assert y.data_ptr() != xt.data_ptr()


def test_dtypes_preserved():
    grid, tile = (5, 9, 7), (4, 4, 4)
    for dtype in (torch.bfloat16, torch.float16, torch.int32, torch.bool):
        x = (torch.arange(math.prod(grid)) % 7).to(dtype)
        xt = to_tiles(x, grid, tile, 0)
        assert xt.dtype == dtype
        assert torch.equal(from_tiles(xt, grid, tile, 0), x)


# ----------------------------------------------------------------------------- autograd


@pytest.mark.parametrize("grid,tile", [((5, 9, 7), (4, 4, 4)), ((3, 17, 10), (2, 8, 8)), ((8, 16, 16), (4, 8, 8))])
def test_autograd(grid, tile):
    n = math.prod(grid)
    L = padded_length(grid, tile)
    valid = (tile_gather_index(grid, tile) >= 0).to(torch.float32)

    # to_tiles: ones pass through to every token.
    x = torch.randn(2, 3, n, 4, requires_grad=True)
    to_tiles(x, grid, tile, 2).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))

    # to_tiles with a weighted upstream grad: x.grad == from_tiles(w).
    x.grad = None
    w = torch.randn(2, 3, L, 4)
    (to_tiles(x, grid, tile, 2) * w).sum().backward()
    assert torch.equal(x.grad, from_tiles(w, grid, tile, 2))

    # from_tiles: valid slots get ones, padding slots get exactly zero.
    xt = torch.randn(2, L, 3, requires_grad=True)
    from_tiles(xt, grid, tile, 1).sum().backward()
    assert torch.equal(xt.grad, valid.view(1, L, 1).expand(2, L, 3))


def test_gradcheck_and_double_backward():
    grid, tile = (3, 5, 6), (2, 4, 4)
    n, L = math.prod(grid), padded_length(grid, tile)
    x = torch.randn(n, 2, dtype=torch.float64, requires_grad=True)
    xt = torch.randn(2, L, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: to_tiles(a, grid, tile, 0), (x,))
    assert torch.autograd.gradcheck(lambda a: from_tiles(a, grid, tile, 1), (xt,))
    assert torch.autograd.gradgradcheck(lambda a: to_tiles(a, grid, tile, 0), (x,))
    assert torch.autograd.gradgradcheck(lambda a: from_tiles(a, grid, tile, 1), (xt,))


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "bad",
    [(4, 4), (4, 4, 4, 4), (0, 4, 4), (4, -1, 4), (4.0, 4, 4), (True, 4, 4), "abc", 4, None, (4, "4", 4)],
)
def test_bad_grid_and_tile(bad):
    good = (4, 4, 4)
    fns = [
        lambda g, t: tile_counts(g, t),
        lambda g, t: padded_length(g, t),
        lambda g, t: variable_block_sizes(g, t),
        lambda g, t: tile_gather_index(g, t),
        lambda g, t: tile_scatter_index(g, t),
        lambda g, t: to_tiles(torch.zeros(64), g, t, 0),
        lambda g, t: from_tiles(torch.zeros(64), g, t, 0),
    ]
    for fn in fns:
        with pytest.raises(ValueError, match="grid"):
            fn(bad, good)
        with pytest.raises(ValueError, match="tile"):
            fn(good, bad)


def test_bad_tensor_inputs():
    grid, tile = (5, 9, 7), (4, 4, 4)
    n, L = math.prod(grid), padded_length(grid, tile)
    with pytest.raises(ValueError, match=r"x\.shape"):
        to_tiles(torch.zeros(2, n + 1), grid, tile, 1)
    with pytest.raises(ValueError, match=r"x_tiled\.shape"):
        from_tiles(torch.zeros(2, n), grid, tile, 1)  # raster length, not padded
    with pytest.raises(ValueError, match="dim"):
        to_tiles(torch.zeros(2, n), grid, tile, 2)
    with pytest.raises(ValueError, match="dim"):
        from_tiles(torch.zeros(2, L), grid, tile, -3)
    with pytest.raises(ValueError, match="dim"):
        to_tiles(torch.zeros(2, n), grid, tile, 1.0)
    with pytest.raises(ValueError, match="x"):
        to_tiles([0.0] * n, grid, tile, 0)
    with pytest.raises(ValueError, match="x_tiled"):
        from_tiles(None, grid, tile, 0)
    with pytest.raises(ValueError, match="device"):
        tile_gather_index(grid, tile, device="not-a-device")
