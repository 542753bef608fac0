"""Model presets: latent grids, padded lengths, ragged tiles; arch parsing."""


import pytest

from fastvideo_cute import tiling, warmup
from fastvideo_cute.warmup_presets import PRESETS, get_preset


# ---------------------------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name, heads, grid, tokens", [
    ("wan2.1-1.3b-480p", 12, (21, 30, 52), 32760),
    ("wan2.1-14b-480p", 40, (21, 30, 52), 32760),
    ("wan2.1-14b-720p", 40, (21, 45, 80), 75600),
    ("hunyuanvideo-720p", 24, (33, 45, 80), 118800),
])
def test_preset_latent_grids(name, heads, grid, tokens):
    p = get_preset(name)
    assert (p.heads, p.head_dim) == (heads, 128)
    assert p.latent_grid == grid and p.tokens == tokens


def test_preset_sequence_lengths_are_the_padded_tiled_lengths():
    wan13 = get_preset("wan2.1-1.3b-480p")
    assert tiling.tile_counts(wan13.latent_grid, (4, 4, 4)) == (6, 8, 13)
    assert wan13.seq_len(64) == 624 * 64 == 39936
    assert wan13.topk(64) == 63  # ceil(0.1 * 624)
    wan14 = get_preset("wan2.1-14b-720p")
    assert tiling.tile_counts(wan14.latent_grid, (4, 4, 4)) == (6, 12, 20)
    assert wan14.seq_len(64) == 92160
    for p in PRESETS.values():
        for block in (64, 128, 256):
            s = p.seq_len(block)
            assert s % block == 0 and s >= p.tokens
            assert s == tiling.padded_length(p.latent_grid, warmup.tile_for_block(block))
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("wan3")


def test_preset_workloads_use_ragged_tiles():
    (w,) = warmup.preset_workloads("wan2.1-1.3b-480p", [64], None, "bhsd", 1, None)
    assert (w.heads, w.seq_len, w.head_dim, w.block_size, w.dtype, w.entry) == (12, 39936, 128, 64, "bf16", "vsa")
    assert not w.all_full and w.name == "wan2.1-1.3b-480p/vsa/b64/bf16/bhsd"
    sizes = tiling.variable_block_sizes(w.grid, w.tile)
    assert sizes.numel() == w.num_blocks and int(sizes.min()) < 64  # 30 = 7 * 4 + 2: partial tiles


# ---------------------------------------------------------------------------------------------- enumeration


def test_parse_arch():
    for text, want in [("sm_90", (9, 0)), ("sm_90a", (9, 0)), ("90", (9, 0)), ("9.0", (9, 0)), ("sm_100a", (10, 0)),
                       ("sm_120", (12, 0)), ("sm_121a", (12, 1)), ("12.1", (12, 1))]:
        assert warmup.parse_arch(text) == want, text
    with pytest.raises(ValueError):
        warmup.parse_arch("hopper")
