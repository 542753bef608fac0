#!/usr/bin/env python
"""Where the 64-token backward's time goes: our warp-specialized chain (the ``sm90`` route's
configuration) beside cuDNN BSA's blk64 backward (the ``cudnn`` route's q grouping, and cuDNN's
default), kernel by kernel, on ``bench_vsa``'s cases (B=1, H=12, D=128, bf16, 87.5 %, random top-k
maps; ``grid`` = the Wan-1.3B 480p grid with 4x4x4 tiles).

Two modes:

* ``--mode kernels`` (default): ``torch.profiler`` over ``--iters`` calls of each chain, after a
  warm-up; per chain the mean device time of every kernel (its name shortened), the chain's summed
  kernel time and its wall time per call (CUDA events over the same calls). JSON to ``--out``.
* ``--mode ncu``: one call of each chain between ``cudaProfilerStart`` / ``Stop`` (compiles and
  metadata before), for Nsight Compute::

    ncu --profile-from-start off -k regex:"bwd_cudnn|BlockSparseBwd64Sm90Ws" \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section InstructionStats python benchmarks/profile_bwd64_sm90.py --mode ncu --cases 32768
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def route_ws_config() -> dict:
    """The ``sm90`` route's build of the warp-specialized kernel (``backends/sm90_backend._BWD_WS_CONFIG``;
    the profiles of 2026-12-03 in benchmarks/results ran its configuration then: narrow_dq, p_stages=2)."""
    from fastvideo_cute.backends.sm90_backend import _BWD_WS_CONFIG

    return dict(_BWD_WS_CONFIG)


def short_name(name: str) -> str:
    """A kernel's name without the CuTe DSL's mangled argument list."""
    for key, short in (("BlockSparseBwd64Sm90Ws", "ours:main"), ("bwd_cudnn", "cudnn:main"),
                       ("preprocess", "preprocess"), ("postprocess", "postprocess"),
                       ("bucketed", "cudnn:k2q_csr"), ("k2q", "cudnn:k2q_csr")):
        if key in name:
            return short if ":" in short else f"{'cudnn' if 'cudnn' in name else 'ours'}:{short}"
    name = re.sub(r"<.*", "", name)
    return name[:90]


def build_entries(name: str, ws_config: dict):
    import torch

    from explore_bwd64_sm90 import backward_case
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.adapters.cudnn_bsa_support import cudnn_bwd_bucket
    from fastvideo_cute.adapters.cute_sm90_bwd64 import sm90_block_sparse_bwd64

    case, q, k, v, do, sizes, kidx, knum, meta, o, lse = backward_case(name)
    s = q.shape[2]
    lse_c = lse.contiguous()
    bucket = cudnn_bwd_bucket(torch.cuda.get_device_capability(), 64, s)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    entries = {
        "ours": lambda: sm90_block_sparse_bwd64(q, k, v, o, do, lse_c, kidx, knum, sizes, main="ws",
                                                ws_config=dict(ws_config)),
        "cudnn-route": lambda: C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, meta, bshd=False, softmax_scale=None,
                                                    dq=grads[0], dk=grads[1], dv=grads[2],
                                                    bucket_size_blocks=bucket),
    }
    if bucket is not None:
        entries["cudnn-default"] = lambda: C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, meta, bshd=False,
                                                                softmax_scale=None, dq=grads[0], dk=grads[1],
                                                                dv=grads[2])
    info = {"case": name, "seqlen": s, "tiles": "full" if case.all_full else "partial", "cudnn_bucket": bucket}
    return info, entries


def kernels_mode(args) -> list:
    import torch
    from torch.profiler import ProfilerActivity, profile

    rows = []
    for name in args.cases:
        info, entries = build_entries(name, route_ws_config())
        for fn in entries.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        row = dict(info, chains={})
        for key, fn in entries.items():
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                start.record()
                for _ in range(args.iters):
                    fn()
                stop.record()
                torch.cuda.synchronize()
            per = defaultdict(float)
            for ev in prof.events():
                if ev.device_type == torch.autograd.DeviceType.CUDA:
                    per[short_name(ev.name)] += ev.time_range.elapsed_us() / 1000.0 / args.iters  # us -> ms
            row["chains"][key] = {"wall_ms": start.elapsed_time(stop) / args.iters,
                                  "kernel_ms": sum(per.values()),
                                  "kernels_ms": dict(sorted(per.items(), key=lambda kv: -kv[1]))}
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    return rows


def ncu_mode(args) -> None:
    import torch

    for name in args.cases:
        _, entries = build_entries(name, route_ws_config())
        for fn in entries.values():
            for _ in range(2):
                fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        entries["ours"]()
        entries["cudnn-route"]()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("kernels", "ncu"), default="kernels")
    ap.add_argument("--cases", nargs="+", default=["32768", "65536", "grid"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.mode == "ncu":
        ncu_mode(args)
        return 0
    rows = kernels_mode(args)
    if args.out:
        import bench_vsa
        Path(args.out).write_text(json.dumps({"env": bench_vsa.environment(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
