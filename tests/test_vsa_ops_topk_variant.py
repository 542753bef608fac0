"""The top-k kernel variant ``video_sparse_attn``'s selection takes per row width (vsa_ops._topk_variant):
the one-warp bisect kernel up to 1536 kv blocks, the two-warp one up to 4096 (measured fastest on the
H200 by kernel time at 624 and 1180 columns, benchmarks/results/glue_h200_v5.json, and at 2160,
glue_h200_v2.json), the rows kernel past 4096 (the bisect kernel's register budget). Every variant
gives the same lists (tests/kernels/triton/)."""

from fastvideo_cute import vsa_ops
from fastvideo_cute.kernels.triton.vsa_select import parse_topk_variant


def test_variant_by_width():
    assert vsa_ops._topk_variant(16) == "bisectw1"
    assert vsa_ops._topk_variant(624) == "bisectw1"
    assert vsa_ops._topk_variant(1024) == "bisectw1"
    assert vsa_ops._topk_variant(1180) == "bisectw1"
    assert vsa_ops._topk_variant(1536) == "bisectw1"
    assert vsa_ops._topk_variant(2160) == "bisectw2"
    assert vsa_ops._topk_variant(4096) == "bisectw2"
    assert vsa_ops._topk_variant(8192) == vsa_ops._TOPK_VARIANT == "rows1w1x"


def test_every_chosen_variant_parses():
    for kvb in (16, 624, 1180, 2160, 4096, 16384):
        parse_topk_variant(vsa_ops._topk_variant(kvb))
