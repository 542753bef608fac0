#!/usr/bin/env python
"""Per-kernel GPU time of one call of a library route beside the raw peers (torch.profiler).

``bench_vsa.py`` times whole calls; this script shows where the difference between a route and a
peer comes from: every CUDA kernel a call launches, its device time per call, and the call's total
(``gpu_us``). It takes ``bench_vsa.py``'s arguments (same cases, same inputs) and captures the very
callables ``bench_vsa`` would time (its ``Runner.bench`` is swapped for a recorder), so a route
here is exactly the route there, metadata build and padding passes included.

  python benchmarks/profile_route.py --seqlens 32768 --block-size 64 --routes default \
      --peers cudnn-bsa --modes fwd --out prof.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_vsa  # noqa: E402


def profile_call(fn, grad_to_none=None, iters: int = 10) -> dict:
    """Kernels of ``fn`` (device us per call, launches per call), after three warm-up calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def once():
        if grad_to_none:
            for t in grad_to_none:
                t.grad = None
        fn()

    for _ in range(3):
        once()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            once()
        torch.cuda.synchronize()
    kernels = kernel_table(prof, iters, key_len=120)
    return {"gpu_us": sum(k["us"] for k in kernels.values()), "kernels": kernels}


def kernel_table(prof, iters: int, key_len=None) -> dict:
    """``{kernel name: {"us": device us per call, "launches": per call}}`` of a finished
    ``torch.profiler.profile`` over ``iters`` calls, slowest first (names cut to ``key_len``)."""
    kernels = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t and e.count:
            kernels[e.key[:key_len]] = {"us": t / iters, "launches": e.count / iters}
    return dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us"]))


def main(argv=None) -> int:
    import torch

    parser = bench_vsa.build_parser()
    parser.add_argument("--iters", type=int, default=10, help="profiled calls per entry")
    args = parser.parse_args(argv)
    runner = bench_vsa.Runner(args)
    captured = []
    runner.bench = lambda fn, grad_to_none=None: captured.append((fn, grad_to_none)) or 1.0
    shapes = [(None, t) for t in args.tile] if args.grid is not None else [(s, None) for s in args.seqlens]
    rows = []
    for seqlen, tile in shapes:
        for block in ([None] if tile is not None else args.block_size):
            case = bench_vsa.Case(args, seqlen, block, args.sparsity[0], "cuda", tile=tile)
            for mode in args.modes:
                entries = [("route", r, lambda r=r: runner.run_route(r, case, mode)) for r in args.routes]
                entries += [("peer", p, lambda p=p: runner.run_peer(p, case, mode)) for p in args.peers]
                for kind, name, run in entries:
                    captured.clear()
                    n0 = len(runner.results)
                    run()
                    rec = runner.results[n0] if len(runner.results) > n0 else {}
                    if rec.get("status") != "ok" or not captured:
                        print(f"{mode} S={case.seqlen} blk={case.block} {kind} {name}: {rec.get('status')} "
                              f"{rec.get('reason')}", flush=True)
                        continue
                    fn, grads = captured[0]  # the call itself (later captures: the metadata timing)
                    prof = profile_call(fn, grads, args.iters)
                    row = {"mode": mode, "seqlen": case.seqlen, "block": case.block, "tiles":
                           "full" if case.all_full else "partial", "kind": kind, "name": name,
                           "served_by": rec.get("served_by"), **prof}
                    rows.append(row)
                    print(f"{mode} S={case.seqlen} blk={case.block} {row['tiles']} {kind} {name}"
                          f"[{row['served_by'] or ''}]: {prof['gpu_us']:.1f} us", flush=True)
                    for k, v in list(prof["kernels"].items())[:8]:
                        print(f"    {v['us']:9.1f} us x{v['launches']:.0f}  {k[:100]}", flush=True)
            del case
            torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({"env": bench_vsa.environment(), "config": vars(args),
                                              "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
