#!/usr/bin/env python
"""Does the sm90 64-token forward slow down when one head's K/V outgrow the L2? (H200 experiment)

The question behind a kv-split forward (cuDNN's wrapper splits each q2k list by kv range when a
head's K/V exceed 3/4 of the L2, ``_sm90_blk64_auto_kv_splits``): the same kernel, the same number
of selected kv tiles per query tile (the same steps, the same FLOPs), but the selections drawn from
the first ``fraction`` of the kv tiles only, so the K/V bytes that the resident CTAs of one head
touch shrink by that fraction. If the time per step falls as the range shrinks, the call waits on
K/V traffic that an L2-sized split would remove; if it does not, a split would only add its combine.

Cases: S = 65,536 with 12 heads (33.5 MB of K/V per head: below 3/4 of the H200's 50 MB L2) and
S = 92,160 with 40 heads (Wan2.1-14B 720p's padded length: 47 MB per head), B = 1, D = 128, bf16,
every tile full, 1/8 of the kv tiles selected per query tile (sorted random draws, per row), drawn
from the first 1, 1/2 or 1/4 of the kv tiles. Each entry timed with ``triton.testing.do_bench`` in
interleaved rounds (explore_fwd64_sm90's ``bench_rounds``); the outputs are checked finite.

  python benchmarks/explore_kv_working_set.py --out benchmarks/results/kv_working_set_h200.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

CASES = (("S65536-H12", 65536, 12), ("S92160-H40", 92160, 40))
FRACTIONS = (1.0, 0.5, 0.25)


def lists(b, h, qb, kvb, k, fraction, gen, device="cuda"):
    """``(idx, num, span)``: int32 ``[B, H, Qb, k]`` ascending lists of ``k`` distinct tiles of
    ``[0, span)``, ``span = max(k, round(kvb * fraction))``, and their counts (all ``k``)."""
    import torch

    span = max(k, int(round(kvb * fraction)))
    pick = torch.rand(b, h, qb, span, device=device, generator=gen).topk(k, dim=-1).indices
    idx = pick.sort(dim=-1).values.to(torch.int32).contiguous()
    num = torch.full((b, h, qb), k, dtype=torch.int32, device=device)
    return idx, num, span


def main(argv=None):
    import torch

    from bench_vsa import environment
    from explore_fwd64_sm90 import bench_rounds, ours

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rep", type=int, default=50)
    args = ap.parse_args(argv)
    t0 = time.time()
    rows = []
    for name, s, h in CASES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, h, s, 128, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        qb = kvb = s // 64
        topk = kvb // 8
        fns, spans = {}, {}
        for f in FRACTIONS:
            idx, num, span = lists(1, h, qb, kvb, topk, f, gen)
            out, lse = ours(q, k, v, idx, num, None, bshd=False)
            assert torch.isfinite(out).all() and torch.isfinite(lse).all(), (name, f)
            key = f"range {f:g}"
            spans[key] = span
            fns[key] = (lambda idx=idx, num=num: ours(q, k, v, idx, num, None, bshd=False))
        med, all_ms = bench_rounds(fns, args)
        steps = h * qb * topk
        row = {"case": name, "seqlen": s, "heads": h, "kv_tiles": kvb, "selected_per_row": topk,
               "kv_bytes_per_head_mb": 2 * s * 128 * 2 / 2 ** 20,
               "entries": {key: {"span_tiles": spans[key], "kv_mb_touched_per_head": spans[key] * 64 * 128 * 4 / 2 ** 20,
                                 "ms": med[key], "ns_per_step": med[key] * 1e6 / steps,
                                 "vs_full_range": med["range 1"] / med[key]} for key in fns},
               "ms_all": all_ms}
        print(json.dumps({k_: v_ for k_, v_ in row.items() if k_ != "ms_all"}), flush=True)
        rows.append(row)
        del q, k, v
        torch.cuda.empty_cache()
    payload = {"schema": 1, "name": "explore_kv_working_set", "env": environment(), "config": vars(args),
               "seconds": time.time() - t0, "results": rows}
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / "kv_working_set.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
