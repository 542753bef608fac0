#!/usr/bin/env python
"""A/B of the padding probe (``fastvideo_cute.padding_probe``) on partial-tile calls, interleaved.

For each block size on a tiled video grid (partial tiles; padding rows hold zeros, as a tiler
writes them), through the public API on the default route (the route table's choice), times round
robin over ``--rounds`` rounds (``triton.testing.do_bench`` each, L2 flushed, median kept):

- ``train_fwd``: the forward with grad enabled (what a training step runs; the probe launches here);
- ``bwd``: the backward of one such forward (``retain_graph``), as ``bench_vsa.py`` times it;

each with the probe on (the library as it is) and off (``ops._probe_padding`` patched to False: the
backward makes its padding-zeroed K/V copy, the behaviour before the probe). The gradients of both
are compared with each other (same kernels, same inputs: equal up to the backward kernels' own
run-to-run atomics). Writes JSON with per-round times and the medians.

  python benchmarks/ab_padding_probe.py --grid 21 30 52 --tile 4 4 4 --tile 2 8 8 --tile 4 8 8 --out ab_probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=int, nargs=3, default=[21, 30, 52])
    p.add_argument("--tile", type=int, nargs=3, action="append", help="repeatable; default 4 4 4")
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--sparsity", type=float, default=0.875)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)

    import torch
    from triton.testing import do_bench

    import fastvideo_cute as fvc
    from fastvideo_cute import ops
    from fastvideo_cute.tiling import padded_length, variable_block_sizes

    fns = {64: fvc.block_sparse_attn, 128: fvc.block_sparse_attn_128, 256: fvc.block_sparse_attn_256}
    real_probe = ops._probe_padding
    rows = []
    for tile in args.tile or [[4, 4, 4]]:
        block = tile[0] * tile[1] * tile[2]
        s = padded_length(tuple(args.grid), tuple(tile))
        nb = s // block
        g = torch.Generator(device="cuda").manual_seed(block)
        sizes = variable_block_sizes(tuple(args.grid), tuple(tile), device="cuda")
        valid = (torch.arange(block, device="cuda")[None, :] < sizes[:, None]).reshape(1, 1, -1, 1)
        q, k, v, dout = (torch.randn(1, args.heads, s, args.head_dim, device="cuda", dtype=torch.bfloat16,
                                     generator=g) * valid for _ in range(4))
        topk = max(1, round((1 - args.sparsity) * nb))
        scores = torch.rand(1, args.heads, nb, nb, device="cuda", generator=g)
        m = torch.zeros(1, args.heads, nb, nb, dtype=torch.bool, device="cuda")
        m.scatter_(-1, scores.topk(topk, dim=-1).indices, True)
        fn = fns[block]
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]

        def set_probe(on: bool):
            ops._probe_padding = real_probe if on else (lambda *a, **kw: False)

        entries = {}
        grads = {}
        for on in (True, False):
            set_probe(on)
            out, _ = fn(*leaves, m, sizes)
            grads[on] = torch.autograd.grad(out, leaves, dout, retain_graph=True)
            entries[on] = out
        set_probe(True)
        diff = max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()
                   for a, b in zip(grads[True], grads[False]))
        times = {f"{kind}_{'probe' if on else 'copy'}": [] for kind in ("train_fwd", "bwd") for on in (True, False)}
        for _ in range(args.rounds):
            for on in (True, False):
                set_probe(on)
                tag = "probe" if on else "copy"
                times[f"train_fwd_{tag}"].append(float(do_bench(lambda: fn(*leaves, m, sizes), warmup=25, rep=100)))
                out = entries[on]
                times[f"bwd_{tag}"].append(float(do_bench(
                    lambda: torch.autograd.backward(out, dout, retain_graph=True), warmup=25, rep=100,
                    grad_to_none=leaves)))
        set_probe(True)
        med = {key: statistics.median(val) for key, val in times.items()}
        row = {"grid": list(args.grid), "tile": list(tile), "block": block, "seqlen": s, "topk": topk,
               "route": ops.select_route_name(ops.call_info(leaves[0], leaves[1], block, True, False, True, sizes)),
               "ms": times, "median_ms": med, "grad_rel_maxdiff_probe_vs_copy": diff,
               "step_probe_ms": med["train_fwd_probe"] + med["bwd_probe"],
               "step_copy_ms": med["train_fwd_copy"] + med["bwd_copy"]}
        row["step_speedup"] = row["step_copy_ms"] / row["step_probe_ms"]
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("block", "route", "median_ms", "grad_rel_maxdiff_probe_vs_copy",
                                              "step_speedup")}), flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "created": time.strftime("%F %T")}
    Path(args.out).write_text(json.dumps({"name": "ab_padding_probe", "env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
