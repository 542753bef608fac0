#!/usr/bin/env python
"""GPU time of the per-call metadata kernels, by launch config (torch.profiler device time).

- ``map_to_index`` (block map -> q2k lists, what a bool-map ``block_sparse_attn`` call runs on
  the sm90 / cuDNN / Triton routes): every ``(rows per program, warps)`` config of
  ``map_to_index_triton(config=)`` on maps of the benchmark's shapes (12.5 % selected), checked
  equal to the default config's lists;
- the sizes backstop: the Triton kernel beside the torch ops it replaced;
- ``k2q_lists`` (block map -> the backward's kv-owned lists, ``kernels/triton/k2q_lists.py``): every
  ``(columns, rows, warps)`` tile of ``k2q_lists_triton`` beside ``map_to_index`` of the transposed map
  (what ``BlockSparsity.k2q`` runs with ``metadata.FUSED_K2Q`` off), checked equal on the first ``num``
  entries of each list (``--only k2q`` runs this part alone).

Small kernels are timed from the profiler's device times (events around a 5 us kernel measure
the host's launch cost instead).

  python benchmarks/sweep_map_to_index.py --out benchmarks/results/metadata_sweep_h200.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

SHAPES = {  # name: (heads, rows, cols): bench_vsa's cases at B=1, H=12
    "S32768-blk64": (12, 512, 512),
    "wan-grid-blk64": (12, 624, 624),
    "S65536-blk64": (12, 1024, 1024),
    "wan-grid-blk128": (12, 308, 308),
}
CONFIGS = list(itertools.product((1, 2, 4, 8), (1, 2, 4, 8)))


def device_us(fn, iters=20) -> float:
    from profile_route import profile_call

    return profile_call(fn, iters=iters)["gpu_us"]


def main(argv=None) -> int:
    import torch

    from fastvideo_cute import validation
    from fastvideo_cute.kernels.triton.map_to_index import launch_config, map_to_index_triton

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--only", choices=("all", "k2q"), default="all")
    args = p.parse_args(argv)
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    k2q_rows(g, rows)
    if args.only == "k2q":
        return _write(args.out, rows)
    for name, (h, r, c) in SHAPES.items():
        m = torch.rand(1, h, r, c, device="cuda", generator=g) < 0.125
        ref_idx = torch.empty(m.shape, dtype=torch.int32, device="cuda")
        ref_num = torch.empty(m.shape[:-1], dtype=torch.int32, device="cuda")
        map_to_index_triton(m, ref_idx, ref_num)
        default = launch_config(max(1 << (c - 1).bit_length(), 16))
        for cfg in CONFIGS:
            idx, num = torch.empty_like(ref_idx), torch.empty_like(ref_num)
            us = device_us(lambda: map_to_index_triton(m, idx, num, config=cfg))
            same = bool(torch.equal(idx, ref_idx) and torch.equal(num, ref_num))
            rows.append({"kernel": "map_to_index", "shape": name, "rows_cols": [h * r, c], "config": list(cfg),
                         "default": cfg == default, "us": us, "same_lists": same})
            print(f"map_to_index {name:16s} rows{cfg[0]}w{cfg[1]}{' (default)' if cfg == default else '':10s} "
                  f"{us:7.2f} us same={same}", flush=True)
    from fastvideo_cute.kernels.triton.fa4_lists import fa4_lists_launch
    from fastvideo_cute.tiling import variable_block_sizes

    # FA4's forward lists (q-owned, full + partial kv tiles) on the Wan-1.3B grid's 128-token
    # tiles (2, 8, 8) and 256-token tiles (4, 8, 8): the route's metadata kernel.
    for name, tile, kv_factor in (("wan-grid-blk128", (2, 8, 8), 1), ("wan-grid-blk256", (4, 8, 8), 2)):
        sizes = variable_block_sizes((21, 30, 52), tile, device="cuda").to(torch.int32)
        nb = sizes.numel()
        m = (torch.rand(1, 12, nb, nb, device="cuda", generator=g) < 0.125).view(torch.uint8)
        c = nb * kv_factor
        outs = [torch.empty(s, dtype=torch.int32, device="cuda") for s in ((1, 12, nb, c), (1, 12, nb), (1, 12, nb, c), (1, 12, nb))]
        ts = torch.empty(c, dtype=torch.int32, device="cuda")
        ref = None
        for warps in (None, 1, 2, 4):
            run = lambda: fa4_lists_launch(m, sizes, ts, *outs, q_factor=1, kv_factor=kv_factor, kv_tile=128,
                                           transpose=False, all_full=False, num_warps=warps)
            us = device_us(run)
            got = [t.clone() for t in outs]
            ref = ref or got
            same = all(torch.equal(a, b) for a, b in zip(got, ref))
            rows.append({"kernel": "fa4_lists", "shape": name, "cols": c, "num_warps": warps, "us": us, "same_lists": same})
            print(f"fa4_lists {name:16s} warps={warps} {us:7.2f} us same={same}", flush=True)
    sizes = torch.full((624,), 64, dtype=torch.int32, device="cuda")
    sizes[::7] = 16
    triton_us = device_us(lambda: validation._device_backstop(sizes, 64, "variable_block_sizes", 16))
    saved = validation._BACKSTOP
    validation._BACKSTOP = False  # the torch fallback
    try:
        torch_us = device_us(lambda: validation._device_backstop(sizes, 64, "variable_block_sizes", 16))
    finally:
        validation._BACKSTOP = saved
    rows.append({"kernel": "sizes_backstop", "triton_us": triton_us, "torch_ops_us": torch_us})
    print(f"sizes backstop: triton {triton_us:.2f} us, torch ops {torch_us:.2f} us", flush=True)
    return _write(args.out, rows)


def _write(out, rows) -> int:
    import torch

    if out:
        Path(out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


K2Q_TILES = [(c, r, w) for c, r, w in itertools.product((32, 64), (32, 64, 128), (1, 2, 4))
             if c * r >= 32 * w]


def k2q_rows(g, rows) -> None:
    """The k2q lists of the 64-token shapes: ``map_to_index`` of the transposed map, then each tile of
    ``k2q_lists_triton`` (the first ``num`` entries checked equal to it)."""
    import torch

    from fastvideo_cute.kernels.triton import k2q_lists as K
    from fastvideo_cute.metadata import map_to_index

    for name, (h, r, c) in SHAPES.items():
        if not name.endswith("blk64"):
            continue
        m = torch.rand(1, h, r, c, device="cuda", generator=g) < 0.125
        ref_idx, ref_num = map_to_index(m.transpose(-2, -1))
        used = torch.arange(r, device="cuda") < ref_num[..., None]
        base = device_us(lambda: map_to_index(m.transpose(-2, -1)))
        rows.append({"kernel": "k2q_map_to_index_T", "shape": name, "us": base})
        print(f"k2q {name:16s} map_to_index(T) {base:7.2f} us", flush=True)
        idx = torch.empty(1, h, c, r, dtype=torch.int32, device="cuda")
        num = torch.empty(1, h, c, dtype=torch.int32, device="cuda")
        for cb, rb, w in K2Q_TILES:
            idx.fill_(-1)
            K.k2q_lists_triton(m, idx, num, block_c=cb, block_r=rb, num_warps=w)
            same = bool(torch.equal(num, ref_num) and torch.equal(idx[used], ref_idx[used]))
            us = device_us(lambda: K.k2q_lists_triton(m, idx, num, block_c=cb, block_r=rb, num_warps=w))
            default = (cb, rb, w) == (K.BLOCK_C, K.BLOCK_R, K.NUM_WARPS)
            rows.append({"kernel": "k2q_lists", "shape": name, "tile": [cb, rb, w], "default": default, "us": us,
                         "same_lists": same})
            print(f"k2q {name:16s} c{cb}r{rb}w{w}{' (default)' if default else '':10s} {us:7.2f} us same={same}",
                  flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
