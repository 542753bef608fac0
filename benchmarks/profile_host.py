#!/usr/bin/env python
"""Host (CPU) time per call of the library's entry points, with the GPU kept busy.

A long ``torch.cuda._sleep`` is queued first, so no launch in the timed loop waits for the GPU:
the loop's wall time is the host's own cost per call. A host synchronisation inside the call
shows up as a loop far longer than its launches (the loop waits for the sleep): reported.
With ``--cprofile`` the same loop runs under cProfile and the top functions are printed.

  python benchmarks/profile_host.py --cases vsa-fwd vsa-fwdbwd bsa128-fwd --cprofile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

CASES = ("vsa-fwd", "vsa-fwdbwd", "bsa64-fwd", "bsa64-fwdbwd", "bsa128-fwd", "bsa128-fwdbwd",
         "bsa256-fwd")


def _vsa_case(mode, sparsity, preset_name):
    import torch

    import fastvideo_cute as fvc
    from bench_vsa_e2e import Problem
    from fastvideo_cute.warmup_presets import PRESETS

    p = Problem(PRESETS[preset_name], 64, sparsity)
    if mode == "fwd":
        def call():
            with torch.no_grad():
                fvc.video_sparse_attn(p.q, p.k, p.v, p.sizes, p.sizes, p.topk, block_size=p.tile,
                                      compress_attn_weight=p.gate)
        return call
    q, k, v, g = (x.detach().requires_grad_(True) for x in (p.q, p.k, p.v, p.gate))

    def call():
        out = fvc.video_sparse_attn(q, k, v, p.sizes, p.sizes, p.topk, block_size=p.tile, compress_attn_weight=g)
        torch.autograd.grad(out, [q, k, v, g], p.dout)
    return call


def _bsa_case(block, mode, seq, sparsity):
    import torch

    import fastvideo_cute as fvc

    fn = {64: fvc.block_sparse_attn, 128: fvc.block_sparse_attn_128, 256: fvc.block_sparse_attn_256}[block]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 12, seq, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    nb = seq // block
    topk = max(1, math.ceil((1 - sparsity) * nb))
    scores = torch.rand(1, 12, nb, nb, device="cuda", generator=g)
    bmap = fvc.topk_block_map(scores, topk)
    sizes = torch.full((nb,), block, dtype=torch.int32, device="cuda")
    if mode == "fwd":
        def call():
            with torch.no_grad():
                fn(q, k, v, bmap, sizes)
        return call
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
    dout = torch.randn_like(q)

    def call():
        out, _ = fn(qg, kg, vg, bmap, sizes)
        torch.autograd.grad(out, [qg, kg, vg], dout)
    return call


def host_ms(call, iters, profiler=None):
    import torch

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    gpu_plus_host = (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda._sleep(int(2e9))  # ~1 s of GPU work ahead of the loop
    t0 = time.perf_counter()
    if profiler:
        profiler.enable()
    for _ in range(iters):
        call()
    if profiler:
        profiler.disable()
    host = (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda.synchronize()
    return host, gpu_plus_host


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    ap.add_argument("--sparsity", type=float, nargs="+", default=[0.875, 0.9])
    ap.add_argument("--seq", type=int, default=32768)
    ap.add_argument("--preset", default="wan2.1-1.3b-480p")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument("--out", default=None)
    ap.add_argument("--outdir", default=None, help="one cProfile text per case and sparsity")
    args = ap.parse_args(argv)
    import torch

    rows = []
    for case in args.cases:
        what, mode = case.split("-")
        for s in args.sparsity:
            call = _vsa_case(mode, s, args.preset) if what == "vsa" else _bsa_case(int(what[3:]), mode, args.seq, s)
            host, wall = host_ms(call, args.iters)
            torch.cuda.set_sync_debug_mode("warn")
            import warnings
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                call()
            torch.cuda.set_sync_debug_mode(0)
            syncs = sorted({str(x.message)[:160] for x in w})
            row = {"case": case, "sparsity": s, "host_ms": host, "loop_ms": wall, "sync_warnings": syncs}
            print(json.dumps(row), flush=True)
            if args.cprofile:
                pr = cProfile.Profile()
                host_ms(call, args.iters, profiler=pr)
                buf = io.StringIO()
                st = pstats.Stats(pr, stream=buf).strip_dirs()
                st.sort_stats("tottime").print_stats(args.top)
                st.sort_stats("cumulative").print_stats(args.top)
                text = buf.getvalue()
                if args.outdir:
                    Path(args.outdir).mkdir(parents=True, exist_ok=True)
                    Path(args.outdir, f"{case}_{s}.txt").write_text(text)
                else:
                    print(text[:12000])
            rows.append(row)
    if args.out:
        Path(args.out).write_text(json.dumps({"name": "profile_host", "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
