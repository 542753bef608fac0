"""Model presets for ``fastvideo-cute-warmup``: the attention shapes real video DiTs call VSA with.

A preset is a model (heads, head_dim) at a resolution and clip length. The latent grid the
attention sees is the pixel video after the VAE and the DiT's patchify:

    T = (frames - 1) // vae_t + 1        (causal video VAE: the first frame is its own latent)
    H = height // vae_s // patch_h
    W = width  // vae_s // patch_w

Wan2.1 and HunyuanVideo both use a 4x temporal / 8x spatial VAE and a (1, 2, 2) patchify, so:

- Wan2.1 480p, 832x480, 81 frames:    T = 80 // 4 + 1 = 21, H = 480 // 8 // 2 = 30,
  W = 832 // 8 // 2 = 52  ->  (21, 30, 52), 32,760 tokens.
- Wan2.1 720p, 1280x720, 81 frames:   T = 21, H = 720 // 16 = 45, W = 1280 // 16 = 80
  ->  (21, 45, 80), 75,600 tokens.
- HunyuanVideo 720p, 1280x720, 129 frames: T = 128 // 4 + 1 = 33  ->  (33, 45, 80), 118,800 tokens.

Heads: Wan2.1 1.3B has model dim 1536 = 12 heads x 128; Wan2.1 14B has 5120 = 40 x 128;
HunyuanVideo (13B) has 3072 = 24 x 128.

VSA cuts the grid into 3-D tiles (FastVideo's Wan VSA uses (4, 4, 4) = 64 tokens) and the
attention runs over the padded tiled sequence (``fastvideo_cute.tiling.padded_length``):

- (21, 30, 52), tile (4, 4, 4): tiles 6 x 8 x 13 = 624 -> 39,936 tokens (624 kv blocks).
- (21, 45, 80), tile (4, 4, 4): tiles 6 x 12 x 20 = 1440 -> 92,160 tokens.
- (33, 45, 80), tile (4, 4, 4): tiles 9 x 12 x 20 = 2160 -> 138,240 tokens.

``tests/test_warmup.py`` checks these numbers against the tiling module.

Sparsity: FastVideo's VSA default keeps ``1 - 0.9`` of the kv blocks per query block, i.e.
``topk = ceil((1 - sparsity) * num_kv_blocks)``. Sparsity changes no compiled kernel (it is a
runtime list length), so it only matters for the steady-state time the warm-up reports.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Tuple

__all__ = ["ModelPreset", "PRESETS", "TILES", "tile_for_block", "get_preset"]

Shape3 = Tuple[int, int, int]

#: The tile each logical block size is cut from (product = block size). 64 is FastVideo's
#: (4, 4, 4); 128 and 256 follow ``fastvideo_cute.tiling``'s examples.
TILES: Dict[int, Shape3] = {64: (4, 4, 4), 128: (2, 8, 8), 256: (4, 8, 8)}


def tile_for_block(block_size: int) -> Shape3:
    if block_size not in TILES:
        raise ValueError(f"block size must be one of {tuple(TILES)}, got {block_size}")
    return TILES[block_size]


@dataclasses.dataclass(frozen=True)
class ModelPreset:
    name: str
    description: str
    heads: int
    head_dim: int
    frames: int
    height: int
    width: int
    vae_stride: Shape3 = (4, 8, 8)
    patch: Shape3 = (1, 2, 2)
    block_size: int = 64  # default tile (4, 4, 4); the CLI's --block overrides it
    sparsity: float = 0.9
    dtype: str = "bf16"

    @property
    def latent_grid(self) -> Shape3:
        vt, vs_h, vs_w = self.vae_stride
        pt, ph, pw = self.patch
        t = (self.frames - 1) // vt + 1
        if t % pt:
            raise ValueError(f"{self.name}: latent frames {t} not divisible by the temporal patch {pt}")
        return (t // pt, self.height // vs_h // ph, self.width // vs_w // pw)

    @property
    def tokens(self) -> int:
        t, h, w = self.latent_grid
        return t * h * w

    def seq_len(self, block_size: int) -> int:
        """Padded tiled sequence length for the tile of ``block_size``."""
        from .tiling import padded_length

        return padded_length(self.latent_grid, tile_for_block(block_size))

    def num_blocks(self, block_size: int) -> int:
        return self.seq_len(block_size) // block_size

    def topk(self, block_size: int) -> int:
        return max(1, math.ceil((1.0 - self.sparsity) * self.num_blocks(block_size)))


PRESETS: Dict[str, ModelPreset] = {p.name: p for p in (
    ModelPreset("wan2.1-1.3b-480p", "Wan2.1 T2V 1.3B, 832x480, 81 frames", heads=12, head_dim=128,
                frames=81, height=480, width=832),
    ModelPreset("wan2.1-14b-480p", "Wan2.1 T2V/I2V 14B, 832x480, 81 frames", heads=40, head_dim=128,
                frames=81, height=480, width=832),
    ModelPreset("wan2.1-14b-720p", "Wan2.1 T2V/I2V 14B, 1280x720, 81 frames", heads=40, head_dim=128,
                frames=81, height=720, width=1280),
    ModelPreset("hunyuanvideo-720p", "HunyuanVideo 13B, 1280x720, 129 frames", heads=24, head_dim=128,
                frames=129, height=720, width=1280),
)}


def get_preset(name: str) -> ModelPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
