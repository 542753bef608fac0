#!/usr/bin/env python
"""Sweep cuDNN BSA's backward q-group size (``bucket_size_blocks`` of its k2q CSR) on the GPU.

``--block 64`` (default) or ``128`` (cuDNN's SM90 blk128 backward, default group 256 q blocks;
with one group it writes dK/dV directly). ``--rounds N`` times every bucket N times, round robin
with the order rotated each round, and keeps the median (``ms``) and every round (``ms_rounds``).

cuDNN's SM90 blk64 backward splits the query blocks attending each kv block into groups of
``bucket_size_blocks`` (default 384) and accumulates dK/dV over the groups with fp32 atomics
(zero-filled workspace, then a convert pass). This times the backward (the adapter's
``cudnn_bwd_prebuilt``, the metadata prebuilt) for several group sizes on the shapes the library
serves, and checks each result against the default's (fp32 atomics reorder sums: a small
difference is expected, a large one is a bug).

  python benchmarks/sweep_cudnn_bwd.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _case(name, seq, sizes, topk, block=64, heads=12, d=128, seed=0):
    import torch

    from fastvideo_cute.adapters.cudnn_bsa import cudnn_block_sparse_fwd
    from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
    from fastvideo_cute.validation import check_block_sizes

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, dout = (torch.randn(1, heads, seq, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    nb = seq // block
    scores = torch.rand(1, heads, nb, nb, device="cuda", generator=g)
    idx = torch.topk(scores, topk, dim=-1).indices.sort(-1).values.to(torch.int32).contiguous()
    num = torch.full((1, heads, nb), topk, dtype=torch.int32, device="cuda")
    sizes = check_block_sizes(sizes, nb, block, q.device)
    all_full = bool((sizes == block).all())
    out, lse, saved = cudnn_block_sparse_fwd(q, k, v, idx, num, sizes, block_size=block, bshd=False,
                                             softmax_scale=d ** -0.5, all_full=all_full, need_backward=True)
    meta = build_cudnn_metadata(idx, num, sizes, block_size=block, batch=1, heads=heads, q_len=seq, kv_len=seq,
                                all_full=all_full, smallest=int(sizes.min()))
    kk = saved.k if saved.k is not None else k
    vv = saved.v if saved.v is not None else v
    return dict(name=name, seq=seq, topk=topk, args=(dout, q, kk, vv, out, lse, meta), nb=nb)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--buckets", type=int, nargs="+", default=[0, 128, 256, 512, 640, 1024, 2048])
    ap.add_argument("--out", default=None)
    ap.add_argument("--block", type=int, choices=(64, 128), default=64)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args(argv)
    import statistics

    import torch
    from triton.testing import do_bench

    import fastvideo_cute as fvc
    from fastvideo_cute.adapters.cudnn_bsa import cudnn_bwd_prebuilt

    blk = args.block
    default_bucket = 384 if blk == 64 else 256
    tile = (4, 4, 4) if blk == 64 else (2, 8, 8)
    wan = fvc.variable_block_sizes((21, 30, 52), tile, device="cuda")
    full = lambda seq: torch.full((seq // blk,), blk, dtype=torch.int32, device="cuda")  # noqa: E731
    cases = [_case("wan1.3b-480p grid", wan.numel() * blk, wan, round(0.125 * wan.numel()), blk),
             _case("S=32768 full", 32768, full(32768), 32768 // blk // 8, blk),
             _case("S=65536 full", 65536, full(65536), 65536 // blk // 8, blk)]
    rows = []
    for c in cases:
        fns, ref, diffs, times = {}, None, {}, {}
        for bucket in args.buckets:
            b = None if bucket == 0 else bucket
            fn = lambda b=b: cudnn_bwd_prebuilt(*c["args"], bshd=False, softmax_scale=128 ** -0.5,  # noqa: E731
                                                bucket_size_blocks=b)
            try:
                grads = fn()
            except Exception as exc:  # noqa: BLE001 - one failing size is reported, not fatal
                rows.append({"case": c["name"], "block": blk, "bucket": bucket,
                             "error": f"{type(exc).__name__}: {exc}"[:300]})
                print(rows[-1], flush=True)
                continue
            if ref is None:
                ref = [g.float() for g in grads]
            diffs[bucket] = [float((g.float() - r).abs().max() / r.abs().max().clamp_min(1e-6))
                             for g, r in zip(grads, ref)]
            fns[bucket], times[bucket] = fn, []
        order = list(fns)
        for rnd in range(max(1, args.rounds)):
            k = rnd % len(order)
            for bucket in order[k:] + order[:k]:
                times[bucket].append(float(do_bench(fns[bucket], warmup=5, rep=30)))
        for bucket in order:
            groups = math.ceil(c["nb"] / (bucket or default_bucket))
            rows.append({"case": c["name"], "block": blk, "bucket": bucket or f"default({default_bucket})",
                         "q_groups": groups, "ms": statistics.median(times[bucket]), "ms_rounds": times[bucket],
                         "rel_maxdiff_vs_default": diffs[bucket]})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "ms_rounds"}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"name": "sweep_cudnn_bwd", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
