#!/usr/bin/env python
"""A/B of video_sparse_attn's glue choices end to end, interleaved in one process.

``bench_vsa_e2e.py`` times one configuration per run, and between runs of one session the GPU's
clock drifts by about as much as a glue kernel costs (the sparse kernel alone moved by 2 % between
two runs of 2026-12-02). This script builds one problem (a model preset, 64-token tiles, a gate
given, as ``bench_vsa_e2e.py``), and times the forward (or forward + backward) of each
configuration -- a set of ``vsa_ops`` module settings -- and of FastVideo's ``video_sparse_attn``
round-robin over ``--rounds`` rounds (``triton.testing.do_bench`` each, L2 flushed), keeping the
median per entry. Every configuration's output is compared with the default's (the same top-k lists
give bf16 outputs within one rounding of each other; another selection would differ by O(1)).

  python benchmarks/ab_vsa_glue.py --preset wan2.1-1.3b-480p --sparsity 0.875 --out ab.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# name -> {vsa_ops attribute: value}; "default" is the library as it is
CONFIGS = {
    "default": {},
    "no-overlap": {"_COARSE_OVERLAP": False},
    "onepass": {"_COARSE_VARIANT": "onepass"},
    "p1-128x128w8": {"_COARSE_PHASE_TILES": ((128, 128, None, 8), None)},
    "p2-16x32d128w2": {"_COARSE_PHASE_TILES": (None, (16, 32, 128, 2, 3))},
    # head groups of the gated inference forward (vsa_pipeline): glue beside the previous group's sparse kernel
    # (the min-tiles rule set to 0: split whatever the size)
    "groups1": {"_GATED_HEAD_GROUPS": 1},
    "groups2": {"_GATED_HEAD_GROUPS": 2, "_GATED_GROUP_MIN_TILES": 0},
    "groups3": {"_GATED_HEAD_GROUPS": 3, "_GATED_GROUP_MIN_TILES": 0},
    "groups4": {"_GATED_HEAD_GROUPS": 4, "_GATED_GROUP_MIN_TILES": 0},
    "groups2hp": {"_GATED_HEAD_GROUPS": 2, "_GATED_GROUP_MIN_TILES": 0, "_GATED_GLUE_PRIORITY": -1},
    "groups3hp": {"_GATED_HEAD_GROUPS": 3, "_GATED_GROUP_MIN_TILES": 0, "_GATED_GLUE_PRIORITY": -1},
    # the sm90 forward's kernel configuration (backends.sm90_backend._FWD_VARIANT): Q columns in
    # registers, the eager rescale of every step (the build before 2026-12-03)
    "sm90-q64": {"backends.sm90_backend._FWD_VARIANT": {"q_regs": 64}},
    "sm90-q112": {"backends.sm90_backend._FWD_VARIANT": {"q_regs": 112}},
    "sm90-eager": {"backends.sm90_backend._FWD_VARIANT": {"lazy_rescale": False}},
    # the row-max shuffles and the O rescale skipped where a warp's lanes all keep their maxima
    "sm90-vote": {"backends.sm90_backend._FWD_VARIANT": {"lazy_vote": True}},
    "sm90-novote": {"backends.sm90_backend._FWD_VARIANT": {"lazy_vote": False}},
    # a partial kv tile's K and V loaded as 16-key pieces (no padding rows through the L2): for the
    # Wan-14B A/B, where one head's K/V outgrow the L2
    "sm90-partial": {"backends.sm90_backend._FWD_VARIANT": {"partial_loads": True}},
    # calls with partial kv tiles on the forward's packed_steps (their 16-key pieces four to a step)
    "sm90-packed": {"backends.sm90_backend._PACK_PARTIAL": True},
    # the softmax of every tile over all its columns (narrow_tiles off: the default before 2026-12-03's
    # sixth session runs a tile of <= 16 / 32 keys on the quarter / half of a thread's columns)
    "sm90-wide": {"backends.sm90_backend._FWD_VARIANT": {"narrow_tiles": False}},
    # the forward split by kv range (sm90_fwd64's kv_splits; the default "auto" splits in two where
    # one head's K/V outgrow 0.6 of the L2): forced off / to two ranges
    "sm90-kv1": {"backends.sm90_backend._KV_SPLITS": 1},
    "sm90-kv2": {"backends.sm90_backend._KV_SPLITS": 2},
    "sm90-kv3": {"backends.sm90_backend._KV_SPLITS": 3},
    "sm90-kv4": {"backends.sm90_backend._KV_SPLITS": 4},
    # the kv-range lists by one Triton launch (kernels/triton/kv_range_lists) instead of the torch ops
    "sm90-lists-triton": {"adapters.cute_sm90_fwd64._TRITON_LISTS": True},
    # (--mode fwdbwd) the training forward with the gate pass instead of the fused gate + out_s
    "no-train-gate": {"vsa_autograd._TRAIN_GATE_FUSED": False},
    # (--mode fwdbwd) the coarse attention's backward with its gradient products in tf32x3 (before
    # 2026-12-03: TF32 since; "cbwd-old-tiles" of ab_vsa_glue_h200_train_13b.json set the tiles to
    # None, which the default is now too)
    "cbwd-tf32x3": {"_COARSE_BWD_GRAD_PRECISION": None},
}
# Measured and dropped (benchmarks/results/ab_vsa_glue_h200_v1.json, glue_h200_v7.json): phase 1
# walking head_dim in 32- or 64-lane chunks (a D loop with pipelined loads) gave the same kernel
# time (31.1 vs 31.3 us at Wan-1.3B) and no end-to-end gain, so the kernel keeps one dot over D.


@contextlib.contextmanager
def configured(name):
    """``vsa_ops`` (or, for a dotted key, that module of the package) as configuration ``name`` of
    :data:`CONFIGS` says (any other name, e.g. FastVideo's entry: unchanged), restored on exit."""
    import importlib

    def target(key):  # "attr" of vsa_ops, or "module.path.attr" under fastvideo_cute
        mod, _, attr = key.rpartition(".")
        return importlib.import_module("fastvideo_cute." + (mod or "vsa_ops")), attr

    cfg = CONFIGS.get(name, {})
    old = {key: getattr(*target(key)) for key in cfg}
    for key, v in cfg.items():
        setattr(*target(key), v)
    try:
        yield
    finally:
        for key, v in old.items():
            setattr(*target(key), v)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="wan2.1-1.3b-480p")
    p.add_argument("--sparsity", type=float, nargs="+", default=[0.875])
    p.add_argument("--mode", default="fwd", choices=["fwd", "fwdbwd"])
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--no-fastvideo", action="store_true")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    import torch

    import fastvideo_cute as fvc
    from bench_vsa import environment
    from bench_vsa_e2e import Problem
    from fastvideo_cute.warmup_presets import PRESETS
    from triton.testing import do_bench

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    t0, rows = time.time(), []
    for sparsity in args.sparsity:
        p = Problem(PRESETS[args.preset], 64, sparsity)

        def ours(q, k, v, g):
            return fvc.video_sparse_attn(q, k, v, p.sizes, p.sizes, p.topk, block_size=p.tile, compress_attn_weight=g)

        entries = {name: ours for name in args.configs}
        if not args.no_fastvideo:
            from bench_vsa import _import_fastvideo

            fvk = _import_fastvideo()
            entries["fastvideo"] = lambda q, k, v, g: fvk.video_sparse_attn(
                q, k, v, p.sizes, p.sizes, p.topk, block_size=p.tile, compress_attn_weight=g)

        def timed(call):
            if args.mode == "fwd":
                with torch.no_grad():
                    return float(do_bench(lambda: call(p.q, p.k, p.v, p.gate), warmup=args.warmup, rep=args.rep))
            q, k, v, g = (x.detach().requires_grad_(True) for x in (p.q, p.k, p.v, p.gate))
            return float(do_bench(lambda: torch.autograd.backward(call(q, k, v, g), p.dout), warmup=args.warmup,
                                  rep=args.rep, grad_to_none=[q, k, v, g]))

        with torch.no_grad():
            want = ours(p.q, p.k, p.v, p.gate).float()
        check = {}
        for name in args.configs:
            with configured(name), torch.no_grad():
                check[name] = float((ours(p.q, p.k, p.v, p.gate).float() - want).abs().max())
        times = {name: [] for name in entries}
        for _ in range(args.rounds):
            for name, call in entries.items():
                with configured(name):
                    times[name].append(timed(call))
        med = {name: statistics.median(ts) for name, ts in times.items()}
        row = {"preset": args.preset, "sparsity": sparsity, "mode": args.mode, "topk": p.topk,
               "ms_median": med, "ms_all": times, "max_abs_vs_default": check,
               "vs_default": {n: med["default"] / m for n, m in med.items()} if "default" in med else None,
               "fastvideo_over": ({n: med["fastvideo"] / m for n, m in med.items() if n != "fastvideo"}
                                  if "fastvideo" in med else None)}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("sparsity", "ms_median", "max_abs_vs_default", "fastvideo_over")}),
              flush=True)
    payload = {"schema": 1, "name": "ab_vsa_glue", "env": environment(), "config": vars(args),
               "configs": {n: {a: v for a, v in CONFIGS[n].items()} for n in args.configs},
               "seconds": time.time() - t0, "results": rows}
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / "ab_vsa_glue.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
