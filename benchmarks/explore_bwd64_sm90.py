#!/usr/bin/env python
"""Our Hopper 64-token backward (``adapters/cute_sm90_bwd64``) beside cuDNN BSA's blk64 backward,
on the same inputs, in one run (issue 17).

Cases: ``bench_vsa``'s (B=1, H=12, D=128, bf16, random top-k maps at 87.5 %): S=32768, S=65536 and
the Wan2.1-1.3B 480p grid (21, 30, 52) with 4x4x4 tiles (partial tiles; padding zeroed as the tiling
writes it). Both backwards start from the same forward (cuDNN's: out and natural-log LSE) and time
the whole backward chain each runs (ours: preprocess, work order, main, postprocess, k2q lists
prebuilt; cuDNN: its wrapper with prebuilt q2k metadata, its own CSR and pre/post stages).
Interleaved ``--rounds`` (medians); effective TF/s = 2.5 x 4 B H D pairs 64 x 64 / time. Exactness:
ours against cuDNN's gradients (max |diff| / max |cuDNN|).

  python benchmarks/explore_bwd64_sm90.py --rounds 3 --out benchmarks/results/bwd64_sm90_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def backward_case(name: str):
    """One of the cases (``"32768"``, ``"65536"``, ``"grid"``) with what both backwards start from:
    ``(case, q, k, v, do, sizes, kidx, knum, meta, o, lse)``; the k2q lists for ours, cuDNN's
    metadata, and cuDNN's forward (out, natural-log LSE)."""
    import bench_vsa
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
    from fastvideo_cute.metadata import map_to_index

    grid = name == "grid"
    bargs = bench_vsa.parse_args(["--grid", "21", "30", "52", "--tile", "4", "4", "4"] if grid else
                                 ["--seqlens", name, "--block-size", "64"])
    case = bench_vsa.Case(bargs, None if grid else int(name), None if grid else 64, 0.875, "cuda",
                          tile=bargs.tile[0] if grid else None)
    q, k, v, do, sizes = case.q, case.k, case.v, case.dout, case.sizes
    b, h, s, _ = q.shape
    idx, num = map_to_index(case.block_map)
    kidx, knum = map_to_index(case.block_map.transpose(-1, -2).contiguous())
    meta = build_cudnn_metadata(idx, num, sizes, block_size=64, batch=b, heads=h, q_len=s, kv_len=s,
                                all_full=case.all_full)
    o, lse = C.cudnn_fwd_prebuilt(q, k, v, meta, bshd=False, softmax_scale=None)
    return case, q, k, v, do, sizes, kidx, knum, meta, o, lse


def main(argv=None) -> int:
    import torch
    from triton.testing import do_bench

    import bench_vsa
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.adapters import cute_sm90_bwd64_ws as WS
    from fastvideo_cute.adapters.cute_sm90_bwd64 import sm90_block_sparse_bwd64

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--cases", nargs="+", default=["32768", "65536", "grid"])
    p.add_argument("--variants", nargs="+", default=["atomic", "bulk"],
                   help="configs of ours: atomic, bulk, bulk-smemstats (dq_reduce, and lse2/delta by bulk copy) of the "
                        "single-warpgroup main kernel; ws or ws:key=int,... (the warp-specialized one and its "
                        "configuration, e.g. ws:kv_regs=1,p_stages=2; identity=1 runs the chain with the identity work order, "
                        "triton_groups=0 splits the q groups by the torch ops instead of the Triton launch)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = []
    for name in args.cases:
        case, q, k, v, do, sizes, kidx, knum, meta, o, lse = backward_case(name)
        s = q.shape[2]
        cdq, cdk, cdv = (torch.empty_like(x) for x in (q, k, v))

        def cudnn():
            return C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, meta, bshd=False, softmax_scale=None, dq=cdq, dk=cdk, dv=cdv)

        lse_c = lse.contiguous()
        entries = {"cudnn": cudnn}
        for var in args.variants:
            reduce, _, extra = var.partition("-")
            main, _, cfg = var.partition(":")
            ws_config = {kk: int(vv) for kk, vv in (x.split("=") for x in cfg.split(",") if x)} if main == "ws" else {}
            policy = "identity" if ws_config.pop("identity", 0) else "auto"  # the chain's work order
            triton_groups = bool(ws_config.pop("triton_groups", 1))  # the q-group split's Triton launch

            def entry(reduce=reduce, extra=extra, main=main, ws_config=ws_config, policy=policy,
                      triton_groups=triton_groups):
                WS._TRITON_GROUPS = triton_groups
                try:
                    return sm90_block_sparse_bwd64(q, k, v, o, do, lse_c, kidx, knum, sizes,
                                                   dq_reduce="bulk" if main == "ws" else reduce,
                                                   stats_in_smem=extra == "smemstats",
                                                   main="ws" if main == "ws" else "single", ws_config=ws_config,
                                                   order_policy=policy)
                finally:
                    WS._TRITON_GROUPS = True
            entries[var] = entry
        ref = [t.clone() for t in cudnn()]
        err, finite = {}, {}
        for var in args.variants:
            got = entries[var]()
            torch.cuda.synchronize()
            err[var] = {n: ((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
                        for n, g, r in zip(("dq", "dk", "dv"), got, ref)}
            finite[var] = all(bool(torch.isfinite(g).all()) for g in got)
        times = {key: [] for key in entries}
        keys = list(entries)
        for r in range(args.rounds):  # each round starts one entry later (the clock drifts over a run)
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                times[key].append(float(do_bench(entries[key], warmup=10, rep=args.rep)))
        med = {key: statistics.median(v) for key, v in times.items()}
        # per round, cuDNN's time over the entry's (the same round): drift cancels
        round_ratio = {key: statistics.median(c / t for c, t in zip(times["cudnn"], v)) for key, v in times.items()}
        flops = case.flops["bwd"]
        row = {"case": name, "seqlen": s, "topk": case.topk, "tiles": "full" if case.all_full else "partial",
               "ms_median": med, "ms_rounds": times, "effective_tflops": {k2: flops / m * 1e-9 for k2, m in med.items()},
               "ours_vs_cudnn": {var: med["cudnn"] / med[var] for var in args.variants},
               "round_ratio_vs_cudnn": round_ratio,
               "max_rel_diff_vs_cudnn": err, "finite": finite}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del case
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({"env": bench_vsa.environment(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
