#!/usr/bin/env python
"""FA4's sm_90 block-sparse forward under the knobs its interface leaves open (issue 13: the
128/256-token forward classes run FA4's kernel in FA4's own configuration, so the route can only
beat the raw peer with a better one).

``_flash_attn_fwd`` takes ``mma_pv_is_rs`` (P V with P from registers) and ``intra_wg_overlap``
(the next QK^T issued before this tile's softmax) beside the tile; FA4 picks (True, True) at
head_dim 128 from dense H100 benchmarks. Each configuration runs on ``bench_vsa``'s inputs (B=1,
H=12, D=128, bf16, 87.5 %, random top-k maps, metadata prebuilt by the adapter, the peer
``fa4-bsparse``'s call) over ``--rounds`` rotated rounds; per round the ratio default / config
(above 1: the configuration is faster); outputs compared with the default's.

  python benchmarks/sweep_fa4_fwd.py --seqlens 32768 65536 --blocks 128 256 --rounds 5 --out r.json
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

#: (mma_pv_is_rs, intra_wg_overlap); None keeps FA4's choice
CONFIGS = {"default": (None, None), "ss_pv": (False, None), "no_overlap": (None, False), "ss_pv_no_overlap": (False, False)}


def main(argv=None) -> int:
    import torch
    from triton.testing import do_bench

    import bench_vsa
    from fastvideo_cute.adapters import fa4 as A
    from fastvideo_cute.adapters.fa4 import SingleQStageSeqlen, _to_fa4

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536])
    ap.add_argument("--blocks", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    fa = A.load_fa4()
    arch = A.fa4_arch()
    rows = []
    for seqlen in args.seqlens:
        for block in args.blocks:
            bargs = bench_vsa.parse_args(["--seqlens", str(seqlen), "--block-size", str(block)])
            case = bench_vsa.Case(bargs, seqlen, block, 0.875, "cuda")
            q, k, v = (case.bshd(t) for t in (case.q, case.k, case.v))
            plan = A.fa4_fwd_plan(arch, block)
            meta = A.build_fwd_metadata(case.block_map, case.sizes, plan)

            def call(rs, ol):
                return fa.fwd(q, k, v, softmax_scale=None, causal=False, tile_mn=plan.tile_mn,
                              max_seqlen_q=SingleQStageSeqlen(q.shape[1]) if plan.single_q_stage else None,
                              mask_mod=fa.mask_mod(plan.kv_tile), block_sparse_tensors=_to_fa4(fa, meta.index),
                              aux_tensors=[meta.kv_tile_sizes], return_lse=True, mma_pv_is_rs=rs,
                              intra_wg_overlap=ol)[:2]

            entries = {name: (lambda rs=CONFIGS[name][0], ol=CONFIGS[name][1]: call(rs, ol)) for name in args.configs}
            ref = entries["default"]()[0].float() if "default" in entries else None
            diff = {}
            for name, fn in entries.items():
                got = fn()[0].float()
                torch.cuda.synchronize()
                diff[name] = None if ref is None else (got - ref).abs().max().item()
            times = {name: [] for name in entries}
            keys = list(entries)
            for r in range(args.rounds):
                for name in keys[r % len(keys):] + keys[:r % len(keys)]:
                    times[name].append(float(do_bench(entries[name], warmup=10, rep=args.rep)))
            base = times.get("default")
            row = {"seqlen": seqlen, "block": block, "ms_median": {n: statistics.median(t) for n, t in times.items()},
                   "ms_rounds": times, "max_abs_diff_vs_default": diff,
                   "round_ratio_default_over": (None if base is None else
                                                {n: statistics.median(b / x for b, x in zip(base, t))
                                                 for n, t in times.items()})}
            rows.append(row)
            print(json.dumps({kk: row[kk] for kk in ("seqlen", "block", "ms_median", "round_ratio_default_over",
                                                      "max_abs_diff_vs_default")}), flush=True)
            del case
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({"env": bench_vsa.environment(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
