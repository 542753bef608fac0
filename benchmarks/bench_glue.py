#!/usr/bin/env python
"""Sweep of the VSA glue kernels' tuning variants on real model grids: which variant wins.

The Triton glue kernels of ``video_sparse_attn`` (``fastvideo_cute/kernels/triton/``), the
forward's four and the coarse attention's backward:

  compress  vsa_compress_fwd  (block means of q, k, v)       config=  mode / evict_first / block_t / num_warps
  coarse    vsa_select_fwd    (coarse attention + scores)    tiles= / num_stages= / kv_splits=;
                                                             coarse_variant="twophase" + phase_tiles=
  topk      vsa_topk          (exact top-k -> q2k lists)     variant=
  gate      vsa_gate_fwd      (out = out_s + gate * out_c)   config=  block_t / num_warps / evict_first
  coarsebwd vsa_coarse_bwd    (dqc, dkc, dvc; two phases)    tiles= per phase

Inputs are built as the library builds them (``fastvideo_cute.to_tiles`` of random raster bf16
q/k/v/gate on the preset's latent grid, ``variable_block_sizes`` for the partial edge tiles, the
sizes the library passes), in BHSD and BSHD for compress and gate. Cases: Wan2.1-1.3B 480p
(H=12, 624 blocks) at 87.5 % (topk 78) and 90 % (topk 63) sparsity, Wan2.1-14B 720p (H=40) and
HunyuanVideo 720p (H=24, 2160 blocks) at 87.5 %. Every variant is timed with
``triton.testing.do_bench`` (CUDA events, median, L2 flushed between runs; ``--timer kernels``:
the GPU time of its kernels from ``torch.profiler`` instead, what the end-to-end profile counts,
free of host launch time) and checked on the
GPU against the current default's output of the same run:

  coarsebwd              dqc / dkc / dvc within COARSE_BWD_REL_TOL (max |err| / max |ref|) of the same
                         kernels with fp32 products ("ieee"); bitwise vs the default reported beside it
  gate, topk             bitwise (``torch.equal``; top-k: the same index lists and counts)
  compress               bitwise, or within atol = rtol = 1e-5 of the default where a variant sums
                         in another order (``block_t`` / ``num_warps``; "bitwise" reported beside it)
  coarse                 the same top-k lists (bitwise), scores / lse within atol = rtol = 1e-4
                         (the tf32x3 bound of test_vsa_select_triton's GPU test: three TF32
                         products keep ~2^-22 of each fp32 product over D = 128 terms), bf16
                         out_c within one bf16 rounding flip (rtol 2^-7) + 1e-5; "bitwise" is
                         reported beside it

The coarse variants are timed as the whole ``vsa_select_fwd`` call (coarse kernel, the combine
when split, and the library's top-k for the row width, ``vsa_ops._topk_variant``, whose own time is
in the topk table); ``COARSE2_VARIANTS``
(the two-phase coarse forward, ``coarse_variant="twophase"``) the same way, in the same table.
A failing variant (compile error, out of shared memory, mismatch) is recorded with its reason;
the sweep goes on. The winner of a (case, kernel, layout) is the fastest variant that passed;
the default's time is in the same table, so ``speedup = default_us / us`` compares within one run.

  python benchmarks/bench_glue.py --out benchmarks/results/glue_h200.json
  python benchmarks/bench_glue.py --smoke        # CPU (Triton interpreter), tiny grid: checks only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# (name, config) per kernel; the first entry is the current default.
COMPRESS_VARIANTS = [
    ("default", None),
    ("split", {"mode": "split"}),
    ("preload", {"mode": "preload"}),
    ("split-evict", {"mode": "split", "evict_first": True}),
    ("preload-evict", {"mode": "preload", "evict_first": True}),
    ("split-w8", {"mode": "split", "num_warps": 8}),  # another summation tree: may mismatch
    ("split-w2", {"mode": "split", "num_warps": 2}),  # idem
    ("split-w1", {"mode": "split", "num_warps": 1}),  # idem
    ("split-w1-evict", {"mode": "split", "num_warps": 1, "evict_first": True}),
    ("split-w2-evict", {"mode": "split", "num_warps": 2, "evict_first": True}),
    ("split-w2-bt32", {"mode": "split", "num_warps": 2, "block_t": 32}),
    ("split-w1-bt32", {"mode": "split", "num_warps": 1, "block_t": 32}),
    ("split-w4-bt32", {"mode": "split", "num_warps": 4, "block_t": 32}),
    ("split-w2-bt16", {"mode": "split", "num_warps": 2, "block_t": 16}),
    ("fused-w2", {"mode": "fused", "num_warps": 2}),
]
GATE_VARIANTS = [
    ("default", None),
    ("evict", {"evict_first": True}),
    ("w8", {"num_warps": 8}),
    ("bt128-w4", {"block_t": 128, "num_warps": 4}),
    ("bt128-w8", {"block_t": 128, "num_warps": 8}),
    ("bt256-w8", {"block_t": 256, "num_warps": 8}),
    ("bt32-w2", {"block_t": 32, "num_warps": 2}),
]
# (name, tiles, num_stages, kv_splits); tiles = (BLOCK_Q, BLOCK_KV, BLOCK_D or None, num_warps)
COARSE_VARIANTS = [
    ("default", None, None, 1),
    ("32x32w4-st2", (32, 32, None, 4), 2, 1),
    ("32x32w4-st4", (32, 32, None, 4), 4, 1),
    ("32x32w4-split2", (32, 32, None, 4), None, 2),
    ("64x32w4-st2", (64, 32, None, 4), 2, 1),
    ("64x32w4-split2", (64, 32, None, 4), 2, 2),
    ("64x64w4-st1", (64, 64, None, 4), 1, 1),
    ("64x64w4-st2-split2", (64, 64, None, 4), 2, 2),
    ("64x32w8-split2", (64, 32, None, 8), 2, 2),
    ("16x32w2", (16, 32, None, 2), None, 1),
    ("16x32w4-split2", (16, 32, None, 4), None, 2),
    ("32x32w2", (32, 32, None, 2), None, 1),
    ("32x32w4-split4", (32, 32, None, 4), None, 4),
    ("32x64w4", (32, 64, None, 4), None, 1),
]
# Two-phase coarse forward (vsa_select_fwd(coarse_variant="twophase"), kernels/triton/vsa_coarse_fwd2.py),
# timed and checked like COARSE_VARIANTS against the one-pass default: (name, phase_tiles), phase_tiles =
# (phase-1 cfg, phase-2 cfg), cfg = (BLOCK_Q, BLOCK_KV, BLOCK_D, num_warps[, num_stages]) with None for a
# default, or None (coarse_fwd2_tiles: 64x64 w4 / 64x64, 64 D lanes, w4, 3 stages). Phase-2 BLOCK_D < D
# splits D over programs.
COARSE2_VARIANTS = [
    ("2p-default", None),
    ("2p-p1-128x64w8", ((128, 64, None, 8), None)),
    ("2p-p1-64x128w4", ((64, 128, None, 4), None)),
    ("2p-p1-128x128w8", ((128, 128, None, 8), None)),
    ("2p-p2-64x64d128w4-st2", (None, (64, 64, 128, 4, 2))),
    ("2p-p2-128x64d64w8", (None, (128, 64, 64, 8, 3))),
    ("2p-p2-64x128d64w4-st2", (None, (64, 128, 64, 4, 2))),
    ("2p-p2-64x32d64w4-st4", (None, (64, 32, 64, 4, 4))),
    ("2p-p2-64x64d32w4", (None, (64, 64, 32, 4, 3))),
    ("2p-p2-32x64d64w4", (None, (32, 64, 64, 4, 3))),
    ("2p-p2-32x64d128w4", (None, (32, 64, 128, 4, 2))),
    ("2p-p2-32x32d64w2", (None, (32, 32, 64, 2, 3))),
    ("2p-p1-32x64w4-p2-32x64d64w4", ((32, 64, None, 4), (32, 64, 64, 4, 3))),
    ("2p-p2-64x64d64w4", (None, (64, 64, 64, 4, 3))),
    ("2p-p2-32x32d32w2", (None, (32, 32, 32, 2, 3))),
    ("2p-p2-32x32d128w2", (None, (32, 32, 128, 2, 3))),
    ("2p-p2-32x32d64w1", (None, (32, 32, 64, 1, 3))),
    ("2p-p2-16x32d64w1", (None, (16, 32, 64, 1, 3))),
    ("2p-p2-16x32d128w2", (None, (16, 32, 128, 2, 3))),
    ("2p-p2-32x32d64w2-st2", (None, (32, 32, 64, 2, 2))),
    ("2p-p2-32x32d64w2-st4", (None, (32, 32, 64, 2, 4))),
    ("2p-p2-32x16d64w2", (None, (32, 16, 64, 2, 3))),
    ("2p-p1-64x64w8-p2-32x32d64w2", ((64, 64, None, 8), (32, 32, 64, 2, 3))),
    ("2p-p1-64x64w2-p2-32x32d64w2", ((64, 64, None, 2), (32, 32, 64, 2, 3))),
    ("2p-p1-128x128w8-p2-32x32d64w2", ((128, 128, None, 8), (32, 32, 64, 2, 3))),
    ("2p-p1-32x32w2-p2-32x32d64w2", ((32, 32, None, 2), (32, 32, 64, 2, 3))),
]
# Backward of the coarse attention (vsa_coarse_bwd, two phases, the scratch the library passes): (name,
# keywords) with "tiles" = {"a": cfg, "b": cfg} over coarse_bwd_tiles' defaults, cfg = (BLOCK_Q, BLOCK_KV,
# BLOCK_D or None, num_warps[, num_stages]) (phase a walks kv chunks of BLOCK_KV per BLOCK_Q rows, phase b
# q chunks of BLOCK_Q per BLOCK_KV columns), and "grad_precision" (the four gradient products; S keeps
# the library's tf32x3). The tile-only variants of glue_h200_v8.json: a32x32w4-st2 won everywhere (1.03-1.07x).
_ST2 = (32, 32, None, 4, 2)
COARSE_BWD_VARIANTS = [
    ("default", {}),
    ("a32x32w4-st2", {"tiles": {"a": _ST2}}),
    ("a64x32w4", {"tiles": {"a": (64, 32, None, 4)}}),
    ("b16x32w4", {"tiles": {"b": (16, 32, None, 4)}}),
    ("gtf32", {"grad_precision": "tf32"}),
    ("gtf32-a-st2", {"grad_precision": "tf32", "tiles": {"a": _ST2}}),
    ("gtf32-a64x32w4", {"grad_precision": "tf32", "tiles": {"a": (64, 32, None, 4)}}),
    ("gtf32-a64x32w4-st2", {"grad_precision": "tf32", "tiles": {"a": (64, 32, None, 4, 2)}}),
    ("gtf32-a32x64w4-st2", {"grad_precision": "tf32", "tiles": {"a": (32, 64, None, 4, 2)}}),
    ("gtf32-a64x64w8-st1", {"grad_precision": "tf32", "tiles": {"a": (64, 64, None, 8, 1)}}),
    ("gtf32-a-st2-b64x32w4", {"grad_precision": "tf32", "tiles": {"a": _ST2, "b": (64, 32, None, 4)}}),
    ("gtf32-a-st2-b32x64w4", {"grad_precision": "tf32", "tiles": {"a": _ST2, "b": (32, 64, None, 4)}}),
    ("gtf32-a-st2-b64x64w8", {"grad_precision": "tf32", "tiles": {"a": _ST2, "b": (64, 64, None, 8)}}),
    ("gtf32-a-st2-b16x32w4", {"grad_precision": "tf32", "tiles": {"a": _ST2, "b": (16, 32, None, 4)}}),
]
# The coarse backward's accuracy bound (max |grad - ref| / max |ref|, ref = the same kernels in fp32
# "ieee"): 2^-9, half a bf16 ulp, so the coarse gradients' error stays below the rounding of the bf16
# gradients they are added into.
COARSE_BWD_REL_TOL = 2.0 ** -9
TOPK_VARIANTS = ["search32", "rows1w1", "rows1w1x", "rows2w1x", "rows4w1x", "rows2w2x", "rows4w4x", "rows8w4x",
                 "rows8w8x", "bisectw1", "bisectw2", "bisectw4", "radixw1x", "radixw4x"]

# (name, preset, sparsity); tiles of 64 tokens (4x4x4), as the e2e benchmark's default
CASES = [
    ("wan1.3b-480p-s875", "wan2.1-1.3b-480p", 0.875),
    ("wan1.3b-480p-s90", "wan2.1-1.3b-480p", 0.90),
    ("wan14b-720p-s875", "wan2.1-14b-720p", 0.875),
    ("hunyuan-720p-s875", "hunyuanvideo-720p", 0.875),
]

# coarse tolerance vs the default (see the module docstring)
COARSE_TOL = dict(atol=1e-4, rtol=1e-4)
OUT_TOL = dict(atol=1e-5, rtol=2.0 ** -7)
# compress variants with another summation tree vs the default: a mean of <= 64 bf16 terms summed in
# fp32 in another order differs by a few fp32 ulps of the partial sums (|x| < ~6 for randn data)
MEAN_TOL = dict(atol=1e-5, rtol=1e-5)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=[c[0] for c in CASES], choices=[c[0] for c in CASES])
    p.add_argument("--kernels", nargs="+", default=["compress", "coarse", "topk", "gate", "coarsebwd"],
                   choices=["compress", "coarse", "topk", "gate", "coarsebwd"])
    p.add_argument("--layouts", nargs="+", default=["bhsd", "bshd"], choices=["bhsd", "bshd"])
    p.add_argument("--warmup", type=int, default=5, help="do_bench warmup (ms)")
    p.add_argument("--rep", type=int, default=25, help="do_bench repetition time (ms)")
    p.add_argument("--timer", default="do_bench", choices=["do_bench", "kernels"],
                   help="do_bench: CUDA events around each call, L2 flushed (host launch time included when the "
                        "GPU waits for it); kernels: the GPU time of the call's kernels from torch.profiler "
                        "(what bench_vsa_e2e's profile counts), per-kernel split in the row")
    p.add_argument("--iters", type=int, default=20, help="profiled calls per variant (--timer kernels)")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/glue.json)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny grid, fp16, one timed call per variant: runs on CPU through the Triton interpreter")
    return p.parse_args(argv)


class Case:
    """The glue's inputs for one preset and sparsity, built like the library (and bench_vsa_e2e's Problem)."""

    def __init__(self, name, preset_name, sparsity, layout, smoke, device, seed=0):
        import torch

        import fastvideo_cute as fvc
        from fastvideo_cute.warmup_presets import PRESETS, tile_for_block

        self.name, self.layout = name, layout
        if smoke:  # interpreter: a tiny grid with partial tiles, one head of 32, fp16
            grid, self.tile, h, d, dtype = (5, 6, 8), (4, 4, 4), 1, 32, torch.float16
        else:
            preset = PRESETS[preset_name]
            grid, self.tile, h, d, dtype = preset.latent_grid, tile_for_block(64), preset.heads, preset.head_dim, \
                torch.bfloat16
        self.grid, self.block, self.heads, self.head_dim = grid, math.prod(self.tile), h, d
        n = math.prod(grid)
        g = torch.Generator(device=device).manual_seed(seed)
        bshd = layout == "bshd"
        shape = (1, n, h, d) if bshd else (1, h, n, d)
        tiled = [fvc.to_tiles(torch.randn(shape, device=device, dtype=dtype, generator=g), grid, self.tile,
                              dim=1 if bshd else 2) for _ in range(5)]
        self.q, self.k, self.v, self.out_s = tiled[:4]
        self.gate = (tiled[4] * 0.1).contiguous()
        self.sizes = fvc.variable_block_sizes(grid, self.tile, device=device)
        self.nblocks = self.sizes.numel()
        self.topk = max(1, math.ceil((1 - sparsity) * self.nblocks))
        self.sparsity, self.tokens = sparsity, n

    def bhsd(self, x):
        return x.transpose(1, 2) if self.layout == "bshd" else x


def _equal(a, b):
    """Bit for bit (floats compared as bytes: NaN payloads and -0.0 count)."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        a, b = a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8)
    return torch.equal(a, b)


def _close(a, b, atol, rtol):
    """(ok, max abs diff over finite entries); infinities must sit at the same places with the same sign."""
    import torch

    a, b = a.float(), b.float()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    if not torch.equal(fa, fb) or not torch.equal(a[~fa], b[~fb]):
        return False, float("inf")
    if not fa.any():
        return True, 0.0
    diff = (a[fa] - b[fb]).abs()
    return bool((diff <= atol + rtol * b[fb].abs()).all()), float(diff.max())


class Sweep:
    def __init__(self, args):
        import torch

        self.args, self.torch, self.rows = args, torch, []
        self.cuda = torch.cuda.is_available() and not args.smoke
        self.device = "cuda" if self.cuda else "cpu"

    def time_us(self, fn):
        if not self.cuda:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6
        if self.args.timer == "kernels":
            return self.kernel_us(fn)
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=self.args.warmup, rep=self.args.rep, return_mode="median")) * 1e3

    def kernel_us(self, fn):
        """GPU time of one call's kernels (torch.profiler, mean over ``--iters`` calls, no flush):
        the sum, and the per-kernel table kept in ``self.last_kernels`` for the row."""
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        from profile_route import kernel_table

        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(self.args.iters):
                fn()
            torch.cuda.synchronize()
        table = kernel_table(prof, self.args.iters, key_len=60)
        self.last_kernels = {k: round(v["us"], 2) for k, v in table.items()}
        return sum(v["us"] for v in table.values())

    # ------------------------------------------------------------------ kernels

    def compress(self, c):
        torch = self.torch
        from fastvideo_cute.kernels.triton.vsa_compress import vsa_compress_fwd

        b, h, d = 1, c.heads, c.head_dim
        outs = [torch.empty(b, h, c.nblocks, d, device=self.device) for _ in range(3)]

        def run_with(cfg):
            def run():
                vsa_compress_fwd(c.bhsd(c.q), c.bhsd(c.k), c.bhsd(c.v), c.sizes, c.sizes, *outs, block=c.block,
                                 config=cfg)
                return [x.clone() for x in outs] if not getattr(run, "timed", False) else None
            return run

        ref = run_with(None)()
        if self.cuda:
            torch.cuda.synchronize()
        for name, cfg in COMPRESS_VARIANTS:
            run = run_with(cfg)

            def check(got, ref=ref):
                bitwise = all(_equal(a, b_) for a, b_ in zip(got, ref))
                # another summation tree (block_t / num_warps): fp32 rounding of a mean of <= 64 terms
                close = [_close(a, b_, **MEAN_TOL) for a, b_ in zip(got, ref)]
                ok = bitwise or all(c_[0] for c_ in close)
                return ("ok" if ok else "mismatch"), {"bitwise": bitwise,
                                                      "max_abs_means": max(c_[1] for c_ in close)}

            self._timed_once(c, "compress", c.layout, name, cfg, run, check)
        return ref

    def _timed_once(self, c, kernel, layout, name, cfg, run, check):
        def first():
            run.timed = False
            return run()

        def again():
            run.timed = True
            return run()

        row = {"case": c.name, "kernel": kernel, "layout": layout, "variant": name, "config": cfg}
        try:
            outs = first()
            if self.cuda:
                self.torch.cuda.synchronize()
            status, detail = check(outs)
            row.update(status=status, **detail)
            self.last_kernels = None
            row["us"] = self.time_us(again)
            if self.last_kernels:
                row["kernels_us"] = self.last_kernels
        except Exception as exc:  # noqa: BLE001 - one failing variant is reported, not fatal
            row.update(status="error", reason=f"{type(exc).__name__}: {str(exc)[-800:]}")
            if os.environ.get("BENCH_GLUE_TRACE"):
                traceback.print_exc()
        self.rows.append(row)
        us = f"{row['us']:9.1f} us" if "us" in row else " " * 12
        print(f"  {kernel:8s} {layout:4s} {name:22s} {us}  {row['status']}"
              + (f"  ({row.get('reason', '')[:200]})" if row["status"] == "error" else ""), flush=True)

    def coarse_and_topk(self, c, means, do_coarse, do_topk):
        torch = self.torch
        from fastvideo_cute.kernels.triton.vsa_coarse_fwd2 import coarse_fwd2_scratch_numel
        from fastvideo_cute.kernels.triton.vsa_select import (coarse_split_scratch_numel, vsa_select_fwd,
                                                              vsa_topk)

        qc, kc, vc = means
        b, h, qb, d = qc.shape
        kvb = kc.shape[2]
        k = min(c.topk, kvb)
        dev = self.device
        precision = "tf32x3" if self.cuda else "ieee"  # what vsa_ops picks
        from fastvideo_cute.vsa_ops import _topk_variant

        topk_variant = _topk_variant(kvb)  # the library's top-k for this width, inside every coarse variant
        out = torch.empty(b, h, qb, d, dtype=c.q.dtype, device=dev)
        lse = torch.empty(b, h, qb, device=dev)
        idx = torch.empty(b, h, qb, k, dtype=torch.int32, device=dev)
        num = torch.empty(b, h, qb, dtype=torch.int32, device=dev)
        scores = torch.empty(b, h, qb, kvb, device=dev) if k < kvb else None
        max_splits = max(s for *_, s in COARSE_VARIANTS)
        scratch = torch.empty(coarse_split_scratch_numel(b, h, qb, d, max_splits), device=dev)
        # two-phase: the scores buffer also when k == KVb, partials for the variant with the most kv tiles
        scores2 = scores if scores is not None else torch.empty(b, h, qb, kvb, device=dev)
        partials = torch.empty(max(coarse_fwd2_scratch_numel(b, h, qb, kvb, d, pt) for _, pt in COARSE2_VARIANTS),
                               device=dev)

        def select_run(tiles, stages, splits, phase_tiles=None, two_phase=False):
            def run():
                if two_phase:
                    vsa_select_fwd(qc, kc, vc, c.sizes, out, None, lse, idx, num, scores2, topk=c.topk,
                                   sm_scale=d ** -0.5, precision=precision, coarse_variant="twophase",
                                   phase_tiles=phase_tiles, partial_scratch=partials, topk_variant=topk_variant)
                else:
                    vsa_select_fwd(qc, kc, vc, c.sizes, out, None, lse, idx, num, scores, topk=c.topk,
                                   sm_scale=d ** -0.5, precision=precision, tiles=tiles, num_stages=stages,
                                   kv_splits=splits, split_scratch=scratch if splits > 1 else None,
                                   topk_variant=topk_variant)
                if getattr(run, "timed", False):
                    return None
                return [x.clone() for x in (out, lse, idx, num)] + ([scores.clone()] if scores is not None else [])
            return run

        ref = select_run(None, None, 1)()
        if self.cuda:
            torch.cuda.synchronize()
        if do_coarse:
            variants = [(n, t, st, sp, None, False) for n, t, st, sp in COARSE_VARIANTS]
            variants += [(n, None, None, 1, pt, True) for n, pt in COARSE2_VARIANTS]
            for name, tiles, stages, splits, phase_tiles, two_phase in variants:
                def check(got, ref=ref):
                    same_sel = _equal(got[2], ref[2]) and _equal(got[3], ref[3])
                    ok_out, d_out = _close(got[0], ref[0], **OUT_TOL)
                    ok_lse, d_lse = _close(got[1], ref[1], **COARSE_TOL)
                    ok_sc, d_sc = (_close(got[4], ref[4], **COARSE_TOL) if len(ref) > 4 else (True, 0.0))
                    bitwise = all(_equal(a, b_) for a, b_ in zip(got, ref))
                    ok = same_sel and ok_out and ok_lse and ok_sc
                    return ("ok" if ok else "mismatch"), {"bitwise": bitwise, "same_topk": same_sel,
                                                          "max_abs_out": d_out, "max_abs_lse": d_lse,
                                                          "max_abs_scores": d_sc}

                cfg = ({"coarse_variant": "twophase", "phase_tiles": phase_tiles} if two_phase else
                       {"tiles": tiles, "num_stages": stages, "kv_splits": splits})
                self._timed_once(c, "coarse", "-", name, cfg, select_run(tiles, stages, splits, phase_tiles, two_phase),
                                 check)
        if do_topk and scores is not None:
            base = ref[4]
            i2, n2 = torch.empty_like(idx), torch.empty_like(num)
            for variant in TOPK_VARIANTS:
                def run(variant=variant):
                    vsa_topk(base, i2, n2, topk=c.topk, variant=variant)
                    return None if getattr(run, "timed", False) else (i2.clone(), n2.clone())

                def check(got, ref=ref):
                    ok = _equal(got[0], ref[2]) and _equal(got[1], ref[3])
                    return ("ok" if ok else "mismatch"), {"bitwise": ok}

                self._timed_once(c, "topk", "-", variant, variant, run, check)
        return ref[0]  # out_c (the gate's input)

    def coarse_bwd(self, c, means):
        """The coarse attention's backward (both phases, the two fp32 scratch tensors the library
        allocates) per variant (tiles, the gradient products' precision), its dqc / dkc / dvc
        checked against the same kernels with fp32 products (COARSE_BWD_REL_TOL)."""
        torch = self.torch
        from fastvideo_cute.kernels.triton.vsa_coarse_bwd import vsa_coarse_bwd
        from fastvideo_cute.kernels.triton.vsa_select import vsa_select_fwd

        qc, kc, vc = means
        b, h, qb, d = qc.shape
        kvb = kc.shape[2]
        dev = self.device
        precision = "tf32x3" if self.cuda else "ieee"
        k = min(c.topk, kvb)
        out = torch.empty(b, h, qb, d, dtype=c.q.dtype, device=dev)
        out32 = torch.empty(b, h, qb, d, device=dev)
        lse = torch.empty(b, h, qb, device=dev)
        idx = torch.empty(b, h, qb, k, dtype=torch.int32, device=dev)
        num = torch.empty(b, h, qb, dtype=torch.int32, device=dev)
        scores = torch.empty(b, h, qb, kvb, device=dev) if k < kvb else None
        vsa_select_fwd(qc, kc, vc, c.sizes, out, out32, lse, idx, num, scores, topk=c.topk, sm_scale=d ** -0.5,
                       precision=precision)
        g = torch.Generator(device=dev).manual_seed(1)
        dout = torch.randn(b, h, qb, d, device=dev, generator=g).to(c.q.dtype)
        grads = [torch.empty_like(x) for x in (qc, kc, vc)]
        scratch = torch.empty((2, b, h, qb, kvb), device=dev)

        def run_with(kw):
            kw = {"precision": precision, **kw}

            def run():
                vsa_coarse_bwd(qc, kc, vc, c.sizes, dout, out32, lse, *grads, sm_scale=d ** -0.5,
                               p_scratch=scratch[0], ds_scratch=scratch[1], **kw)
                return None if getattr(run, "timed", False) else [x.clone() for x in grads]
            return run

        exact = run_with({"precision": "ieee"})()  # fp32 products throughout: the accuracy reference
        ref = run_with({})()
        for name, kw in COARSE_BWD_VARIANTS:
            def check(got, ref=ref, exact=exact):
                bitwise = all(_equal(a, b_) for a, b_ in zip(got, ref))
                rel = [float((a - e).abs().max() / e.abs().max().clamp(min=1e-30)) for a, e in zip(got, exact)]
                ok = max(rel) <= COARSE_BWD_REL_TOL
                return ("ok" if ok else "mismatch"), {"bitwise_vs_default": bitwise,
                                                      "rel_err_vs_fp32": dict(zip(("dqc", "dkc", "dvc"), rel))}

            self._timed_once(c, "coarsebwd", "-", name, kw, run_with(kw), check)

    def gate(self, c, out_c):
        torch = self.torch
        from fastvideo_cute.kernels.triton.vsa_gate import vsa_gate_fwd

        out = torch.empty_like(c.out_s)

        def run_with(cfg):
            def run():
                vsa_gate_fwd(c.bhsd(c.out_s), out_c, c.bhsd(c.gate), c.bhsd(out), block=c.block, config=cfg)
                return None if getattr(run, "timed", False) else out.clone()
            return run

        ref = run_with(None)()
        for name, cfg in GATE_VARIANTS:
            def check(got, ref=ref):
                ok = _equal(got, ref)
                return ("ok" if ok else "mismatch"), {"bitwise": ok}

            self._timed_once(c, "gate", c.layout, name, cfg, run_with(cfg), check)

    # ------------------------------------------------------------------ driver

    def run(self):
        torch = self.torch
        for case_name, preset, sparsity in CASES:
            if case_name not in self.args.cases:
                continue
            means = out_c = None
            for li, layout in enumerate(self.args.layouts):
                c = Case(case_name, preset, sparsity, layout, self.args.smoke, self.device)
                print(f"{case_name} [{layout}]: grid {c.grid} tile {c.tile} H={c.heads} D={c.head_dim} "
                      f"blocks={c.nblocks} topk={c.topk}", flush=True)
                if "compress" in self.args.kernels:
                    means = self.compress(c)
                elif means is None:
                    from fastvideo_cute.kernels.triton.vsa_compress import vsa_compress_fwd

                    means = [torch.empty(1, c.heads, c.nblocks, c.head_dim, device=self.device) for _ in range(3)]
                    vsa_compress_fwd(c.bhsd(c.q), c.bhsd(c.k), c.bhsd(c.v), c.sizes, c.sizes, *means, block=c.block)
                if li == 0:  # coarse and top-k do not depend on the layout
                    out_c = self.coarse_and_topk(c, means, "coarse" in self.args.kernels,
                                                 "topk" in self.args.kernels)
                    if "coarsebwd" in self.args.kernels:
                        self.coarse_bwd(c, means)
                if "gate" in self.args.kernels:
                    self.gate(c, out_c)
                del c
                if self.cuda:
                    torch.cuda.empty_cache()
            means = out_c = None
        return self.rows


def winners(rows):
    """Per (case, kernel, layout): the default's time, the fastest passing variant, its speed-up."""
    groups = {}
    for r in rows:
        groups.setdefault((r["case"], r["kernel"], r["layout"]), []).append(r)
    out = []
    for (case, kernel, layout), rs in groups.items():
        default = next((r for r in rs if r["variant"] in ("default", "search32")), None)
        ok = [r for r in rs if r.get("status") == "ok" and "us" in r]
        best = min(ok, key=lambda r: r["us"]) if ok else None
        d_us = default.get("us") if default else None
        out.append({"case": case, "kernel": kernel, "layout": layout, "default_us": d_us,
                    "winner": best["variant"] if best else None, "winner_us": best["us"] if best else None,
                    "speedup": (d_us / best["us"]) if best and d_us else None,
                    "failed": [r["variant"] for r in rs if r.get("status") != "ok"]})
    return out


def main(argv=None):
    args = parse_args(argv)
    import torch

    if args.smoke or not torch.cuda.is_available():
        if not args.smoke:
            raise SystemExit("no CUDA GPU: run with --smoke (CPU, Triton interpreter, checks only)")
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from bench_vsa import environment

    t0 = time.time()
    sweep = Sweep(args)
    rows = sweep.run()
    table = winners(rows)
    print("\nwinners (fastest variant that passed; speed-up over the default of the same run):")
    for w in table:
        sp = f"{w['speedup']:.2f}x" if w["speedup"] else "-"
        d = f"{w['default_us']:.1f}" if w["default_us"] else "-"
        b = f"{w['winner_us']:.1f}" if w["winner_us"] else "-"
        print(f"  {w['case']:20s} {w['kernel']:8s} {w['layout']:4s} default {d:>8s} us  winner {str(w['winner']):22s}"
              f" {b:>8s} us  {sp:>6s}" + (f"  failed: {', '.join(w['failed'])}" if w["failed"] else ""))
    payload = {"schema": 1, "name": "bench_glue", "env": environment(), "config": vars(args),
               "seconds": time.time() - t0, "variants": {"compress": COMPRESS_VARIANTS, "gate": GATE_VARIANTS,
                                                          "coarse": COARSE_VARIANTS, "coarse2": COARSE2_VARIANTS,
                                                          "coarsebwd": COARSE_BWD_VARIANTS,
                                                          "topk": TOPK_VARIANTS},
               "results": rows, "winners": table}
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / "glue.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {out} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
