#!/usr/bin/env python
"""Driver for an Nsight Compute profile of the sm_90a 64-token forwards: ours
(``block_sparse_fwd64_sm90``) and cuDNN BSA's blk64, one launch each between
``cudaProfilerStart`` / ``Stop`` (everything else, compiles and metadata included, runs before),
on the benchmark's S=32768 case (B=1, H=12, D=128, bf16, 87.5 %, random top-k map).

  ncu --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
      --section SchedulerStats --section ComputeWorkloadAnalysis python benchmarks/profile_fwd64_sm90.py
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--variant", default="base", help="our kernel's build, explore_fwd64_sm90's grammar (e.g. h)")
    args = ap.parse_args(argv)
    import torch

    from bench_vsa import Case
    from explore_fwd64_sm90 import parse_variant
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
    from fastvideo_cute.adapters.cute_sm90_fwd64 import sm90_fwd64
    from fastvideo_cute.metadata import map_to_index

    cargs = types.SimpleNamespace(grid=None, dtype="bf16", batch=1, heads=12, head_dim=128, seed=0, ragged=False)
    case = Case(cargs, args.seqlen, 64, 0.875, "cuda")
    q, k, v = (case.bshd(t) for t in (case.q, case.k, case.v))
    idx, num = map_to_index(case.block_map)
    idx, num = idx.to(torch.int32).contiguous(), num.to(torch.int32).contiguous()
    meta = build_cudnn_metadata(idx, num, case.sizes, block_size=64, batch=1, heads=12, q_len=case.seqlen,
                                kv_len=case.seqlen, all_full=True)
    variant = parse_variant(args.variant)
    for _ in range(3):  # compile and warm both
        sm90_fwd64(q, k, v, idx, num, None, bshd=True, variant=variant)
        C.cudnn_fwd_prebuilt(q, k, v, meta, bshd=True, softmax_scale=None)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    sm90_fwd64(q, k, v, idx, num, None, bshd=True, variant=variant)
    C.cudnn_fwd_prebuilt(q, k, v, meta, bshd=True, softmax_scale=None)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
