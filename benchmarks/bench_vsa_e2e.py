#!/usr/bin/env python
"""video_sparse_attn end to end on model presets, beside dense FA4 and FastVideo's video_sparse_attn.

What a FastVideo layer calls is video_sparse_attn (compression, top-k, sparse branch, gate), so
this times that, on the latent grids of real presets (partial edge tiles included):

  ours         fastvideo_cute.video_sparse_attn (gate given), the route the environment picks
               (default: the measured route table); the backend that ran is recorded
  fastvideo    fastvideo_kernel.video_sparse_attn (0.3.5) on the same tiled inputs (its
               ThunderKittens path when its extension loads, else Triton: recorded)
  dense-fa4    flash_attn.cute.flash_attn_func on the UNPADDED raster sequence (what the model
               would run without VSA)

Modes: fwd (inference, no grad) and fwdbwd (forward + backward of the whole call). For each row:
speed-up over dense FA4, the ideal speed-up for the grid's padding and sparsity
(dense FLOPs / selected sparse FLOPs), and, with --profile, the glue share of ours: the GPU time
of every kernel that is not the block-sparse attention kernel, from torch.profiler.

  python benchmarks/bench_vsa_e2e.py --presets wan2.1-1.3b-480p wan2.1-14b-720p --tiles 64 --profile
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# Kernel names of the block-sparse attention itself (everything else is glue): our Triton kernels,
# FA4's CuTe kernels, cuDNN BSA's CuTe kernels, FastVideo's TK and Triton kernels.
SPARSE_KERNEL_RE = re.compile(r"_bsa_fwd_kernel|_bsa_bwd_(dq|dkdv)_kernel|flash|Flash|bsa|Bsa|block_sparse|"
                              r"BlockSparse|attn_fwd|attn_bwd|sparse_attn|_attn_", re.I)


def parse_args(argv=None):
    from fastvideo_cute.warmup_presets import PRESETS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", nargs="+", default=["wan2.1-1.3b-480p", "wan2.1-14b-720p"], choices=sorted(PRESETS))
    p.add_argument("--tiles", type=int, nargs="+", default=[64], choices=[64, 128, 256])
    p.add_argument("--sparsity", type=float, nargs="+", default=[0.875])
    p.add_argument("--modes", nargs="+", default=["fwd", "fwdbwd"], choices=["fwd", "fwdbwd"])
    p.add_argument("--entries", nargs="+", default=["ours", "fastvideo", "dense-fa4"],
                   choices=["ours", "ours-triton", "ours-cute", "ours-cudnn", "fastvideo", "dense-fa4"])
    p.add_argument("--profile", action="store_true", help="glue share of ours from torch.profiler")
    p.add_argument("--warmup", type=int, default=25)
    p.add_argument("--rep", type=int, default=100)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every entry of a call this many times, interleaved (ours, FastVideo, dense, then "
                        "again), and report the median with the per-round times and ratios: drift between "
                        "entries measured minutes apart (clocks, FastVideo's own spread) hits every entry alike")
    p.add_argument("--compress-config", default=None,
                   help="JSON config of the block-means kernel (vsa_ops._COMPRESS_CONFIG, e.g. "
                        "'{\"mode\": \"split\", \"num_warps\": 1}'; default: the library's), recorded in the JSON config")
    p.add_argument("--coarse-overlap", default=None, choices=["on", "off"],
                   help="the two-phase coarse forward's phase 2 on a second stream beside the top-k "
                        "(vsa_ops._COARSE_OVERLAP; default: the library's), recorded in the JSON config")
    p.add_argument("--coarse-variant", default=None, choices=["onepass", "twophase"],
                   help="the coarse-attention forward video_sparse_attn runs (vsa_ops._COARSE_VARIANT; "
                        "default: the library's), recorded in the JSON config")
    p.add_argument("--name", default="vsa_e2e_h200")
    p.add_argument("--out", default=None)
    p.add_argument("--plot", default=None, help="PNG path: time per entry and call (needs matplotlib: .[bench])")
    p.add_argument("--replot", nargs="+", default=None, metavar="JSON",
                   help="no benchmark: draw --plot from results JSONs (works on CPU)")
    return p.parse_args(argv)


def _env(values, clear=("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND")):
    from bench_vsa import _env as env

    return env(values, clear=clear)


class Problem:
    def __init__(self, preset, tile_block, sparsity, device="cuda", seed=0):
        import torch

        import fastvideo_cute as fvc
        from fastvideo_cute.warmup_presets import tile_for_block

        self.preset, self.tile = preset, tile_for_block(tile_block)
        self.grid = preset.latent_grid
        self.block = math.prod(self.tile)
        h, d = preset.heads, preset.head_dim
        n = math.prod(self.grid)
        g = torch.Generator(device=device).manual_seed(seed)
        raw = [torch.randn(1, h, n, d, device=device, dtype=torch.bfloat16, generator=g) for _ in range(4)]
        self.raw = raw[:3]  # unpadded raster q, k, v (dense peer)
        tiled = [fvc.to_tiles(x, self.grid, self.tile, dim=2) for x in raw]
        self.q, self.k, self.v = tiled[:3]
        self.gate = (tiled[3] * 0.1).contiguous()
        self.sizes = fvc.variable_block_sizes(self.grid, self.tile, device=device)
        self.nblocks = self.sizes.numel()
        self.topk = max(1, math.ceil((1 - sparsity) * self.nblocks))
        self.sparsity, self.tokens, self.padded = sparsity, n, self.q.shape[2]
        self.dout = torch.randn_like(self.q)
        self.dout_raw = torch.randn_like(self.raw[0])
        # ideal speed-up: dense work on the raster sequence over the selected sparse work
        self.ideal = (n * n) / (self.padded * self.topk * self.block)


class Bench:
    def __init__(self, args):
        import torch

        self.args, self.torch, self.rows = args, torch, []

    def time(self, fn, grad_to_none=None):
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=self.args.warmup, rep=self.args.rep, grad_to_none=grad_to_none))

    def run(self, entry, p, mode, profile=True):
        """Time ``entry`` on problem ``p`` in ``mode``; records (and returns) one row. ``profile``:
        with ``--profile``, also the glue breakdown of ours (the first round only)."""
        torch = self.torch
        extra = {}
        if entry.startswith("ours"):
            import fastvideo_cute as fvc
            from fastvideo_cute import ops

            env = {"ours": {}, "ours-triton": {"FASTVIDEO_VSA_TRITON": "1"},
                   "ours-cute": {"FASTVIDEO_VSA_CUTEDSL": "1"}, "ours-cudnn": {"FASTVIDEO_VSA_BACKEND": "cudnn"}}[entry]
            call = lambda q, k, v, g: fvc.video_sparse_attn(q, k, v, p.sizes, p.sizes, p.topk,  # noqa: E731
                                                            block_size=p.tile, compress_attn_weight=g)
            with _env(env):
                before = ops.dispatch_counts.copy()
                ms = self._timed(call, p, mode)
                extra["served_by"] = sorted({f"{n}:{d}" for (n, d), c in ops.dispatch_counts.items()
                                             if c != before[(n, d)]})
                if profile and self.args.profile and entry in ("ours", "ours-cudnn"):
                    extra["profile"] = self._profile(call, p, mode)
        elif entry == "fastvideo":
            from bench_vsa import _Skip, _import_fastvideo

            try:
                fvk = _import_fastvideo()
            except _Skip as e:
                return self._row(entry, p, mode, "skipped", reason=str(e))
            extra["fastvideo_C_loaded"] = sys.modules["fastvideo_kernel.block_sparse_attn"]._get_sm90_ops()[0] is not None
            call = lambda q, k, v, g: fvk.video_sparse_attn(q, k, v, p.sizes, p.sizes, p.topk,  # noqa: E731
                                                            block_size=p.tile, compress_attn_weight=g)
            with _env({}, clear=("FASTVIDEO_VSA_TRITON", "FASTVIDEO_KERNEL_VSA_FORCE_TRITON", "FASTVIDEO_VSA_TK",
                                 "FASTVIDEO_VSA_CUTEDSL")):
                ms = self._timed(call, p, mode)
        else:  # dense-fa4 on the unpadded sequence
            from flash_attn.cute import flash_attn_func

            q, k, v = (x.transpose(1, 2) for x in p.raw)
            dout = p.dout_raw.transpose(1, 2)
            if mode == "fwd":
                with torch.no_grad():
                    ms = self.time(lambda: flash_attn_func(q, k, v))
            else:
                qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

                def step():
                    out = flash_attn_func(qg, kg, vg)
                    out = out[0] if isinstance(out, tuple) else out
                    torch.autograd.backward(out, dout)

                ms = self.time(step, grad_to_none=[qg, kg, vg])
        return self._row(entry, p, mode, "ok", ms=ms, **extra)

    def _timed(self, call, p, mode):
        torch = self.torch
        if mode == "fwd":
            with torch.no_grad():
                return self.time(lambda: call(p.q, p.k, p.v, p.gate))
        q, k, v, g = (x.detach().requires_grad_(True) for x in (p.q, p.k, p.v, p.gate))

        def step():
            torch.autograd.backward(call(q, k, v, g), p.dout)

        return self.time(step, grad_to_none=[q, k, v, g])

    def _profile(self, call, p, mode):
        torch = self.torch
        from torch.profiler import ProfilerActivity, profile

        q, k, v, g = (x.detach().requires_grad_(mode == "fwdbwd") for x in (p.q, p.k, p.v, p.gate))

        def once():
            if mode == "fwd":
                with torch.no_grad():
                    call(q, k, v, g)
            else:
                # grad(), not backward(): no accumulation into .grad between iterations (that added
                # four full-size adds per step to the profile, which the library does not do)
                torch.autograd.grad(call(q, k, v, g), [q, k, v, g], p.dout)

        for _ in range(3):
            once()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                once()
            torch.cuda.synchronize()
        from profile_route import kernel_table

        kernels = kernel_table(prof, 5)
        total = sum(x["us"] for x in kernels.values())
        sparse = sum(x["us"] for name, x in kernels.items() if SPARSE_KERNEL_RE.search(name))
        return {"gpu_us": total, "sparse_kernel_us": sparse, "glue_us": total - sparse,
                "glue_share": (total - sparse) / total if total else None, "kernels": kernels}

    def _row(self, entry, p, mode, status, ms=None, reason=None, **extra):
        r = {"entry": entry, "preset": p.preset.name, "grid": list(p.grid), "tile": list(p.tile),
             "block": p.block, "sparsity": p.sparsity, "topk": p.topk, "tokens": p.tokens, "padded_tokens": p.padded,
             "heads": p.preset.heads, "mode": mode, "status": status, "ms": ms, "reason": reason,
             "ideal_speedup_vs_dense": p.ideal, **extra}
        self.rows.append(r)
        prof = extra.get("profile")
        glue = f" glue {prof['glue_share'] * 100:.1f}%" if prof and prof.get("glue_share") is not None else ""
        print(f"  {entry:12s} {p.preset.name} tile={p.tile} s={p.sparsity} {mode}: "
              f"{status} {f'{ms:.3f} ms' if ms else reason or ''}{glue} {extra.get('served_by', '')}", flush=True)
        return r


def merge_rounds(rows):
    """One row from an entry's rows of several interleaved rounds: the first failure if any round
    failed, else the first round's row with ``ms`` the median and ``ms_rounds`` every round's."""
    bad = next((r for r in rows if r["status"] != "ok"), None)
    if bad is not None or len(rows) == 1:
        return bad or rows[0]
    out = dict(rows[0])
    out["ms_rounds"] = [r["ms"] for r in rows]
    out["ms"] = statistics.median(out["ms_rounds"])
    return out


def add_speedups(rows):
    by = {}
    for r in rows:
        if r["status"] == "ok":
            by[(r["preset"], tuple(r["tile"]), r["sparsity"], r["mode"], r["entry"])] = r
    for r in rows:
        if r["status"] != "ok":
            continue
        key = (r["preset"], tuple(r["tile"]), r["sparsity"], r["mode"])
        for other in ("dense-fa4", "fastvideo"):
            o = by.get(key + (other,))
            if o and o is not r:
                r[f"speedup_vs_{other}"] = o["ms"] / r["ms"]
                if len(r.get("ms_rounds", ())) > 1 and len(o.get("ms_rounds", ())) == len(r["ms_rounds"]):
                    r[f"speedup_vs_{other}_rounds"] = [a / b for a, b in zip(o["ms_rounds"], r["ms_rounds"])]


def plot(rows, path, title):
    """Grouped bars: ms per entry for each (preset, tile, sparsity, mode), speed-up over FastVideo
    written on ours's bars, glue share in the label."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SystemExit("--plot needs matplotlib: pip install -e '.[bench]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r["status"] == "ok"]
    groups = sorted({(r["preset"], tuple(r["tile"]), r["sparsity"], r["mode"]) for r in ok})
    entries = [e for e in ("ours", "ours-cudnn", "ours-triton", "ours-cute", "fastvideo", "dense-fa4")
               if any(r["entry"] == e for r in ok)]
    colours = {"ours": "#000000", "ours-cudnn": "#76b900", "ours-triton": "#1f77b4", "ours-cute": "#d62728",
               "fastvideo": "#ff7f0e", "dense-fa4": "#7f7f7f"}
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(groups)), 4.5))
    width = 0.8 / max(1, len(entries))
    for i, e in enumerate(entries):
        xs, ys = [], []
        for g, key in enumerate(groups):
            r = next((r for r in ok if (r["preset"], tuple(r["tile"]), r["sparsity"], r["mode"]) == key
                      and r["entry"] == e), None)
            if r is None:
                continue
            xs.append(g + i * width)
            ys.append(r["ms"])
            if e.startswith("ours") and r.get("speedup_vs_fastvideo"):
                ax.text(g + i * width, r["ms"], f"x{r['speedup_vs_fastvideo']:.2f}", ha="center", va="bottom", fontsize=7)
        ax.bar(xs, ys, width, label=e, color=colours.get(e))
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{p}\n{'x'.join(map(str, t))} s={s} {m}" for p, t, s, m in groups], fontsize=7)
    ax.set_ylabel("ms (lower is better); x = speed-up vs FastVideo")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def main(argv=None):
    args = parse_args(argv)
    if args.replot:
        rows, names = [], []
        for path in args.replot:
            payload = json.loads(Path(path).read_text())
            rows += payload["results"]
            names.append(payload.get("name", Path(path).stem))
        print(f"plot: {plot(rows, args.plot or Path(args.replot[0]).with_suffix('.png'), ' + '.join(names))}")
        return 0
    import torch

    from bench_vsa import environment

    from fastvideo_cute import vsa_ops

    if args.coarse_variant is not None:
        vsa_ops._COARSE_VARIANT = args.coarse_variant
    args.coarse_variant = vsa_ops._COARSE_VARIANT
    if args.compress_config is not None:
        vsa_ops._COMPRESS_CONFIG = json.loads(args.compress_config)
    args.compress_config = dict(vsa_ops._COMPRESS_CONFIG)
    if args.coarse_overlap is not None:
        vsa_ops._COARSE_OVERLAP = args.coarse_overlap == "on"
    args.coarse_overlap = "on" if vsa_ops._COARSE_OVERLAP else "off"
    args.gated_head_groups = {"groups": vsa_ops._GATED_HEAD_GROUPS, "min_tiles": vsa_ops._GATED_GROUP_MIN_TILES}

    from fastvideo_cute.warmup_presets import PRESETS

    bench, t0 = Bench(args), time.time()
    for name in args.presets:
        for tile in args.tiles:
            for sp in args.sparsity:
                p = Problem(PRESETS[name], tile, sp)
                for mode in args.modes:
                    per_entry = {entry: [] for entry in args.entries}
                    for rnd in range(args.rounds):
                        for entry in args.entries:
                            try:
                                bench.run(entry, p, mode, profile=rnd == 0)
                            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                                bench._row(entry, p, mode, "error", reason=f"{type(e).__name__}: {e}"[:400])
                            per_entry[entry].append(bench.rows.pop())
                            torch.cuda.empty_cache()
                    bench.rows += [merge_rounds(rows) for rows in per_entry.values()]
                del p
    add_speedups(bench.rows)
    payload = {"schema": 1, "name": args.name, "env": environment(), "config": vars(args),
               "seconds": time.time() - t0, "results": bench.rows}
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print("\nsummary")
    for r in bench.rows:
        if r["status"] == "ok" and r["entry"].startswith("ours"):
            rounds = r.get("speedup_vs_fastvideo_rounds")
            print(f"  {r['entry']} {r['preset']} tile={r['tile']} s={r['sparsity']} {r['mode']}: {r['ms']:.3f} ms, "
                  f"x{r.get('speedup_vs_dense-fa4', float('nan')):.2f} vs dense FA4 (ideal x{r['ideal_speedup_vs_dense']:.2f}), "
                  f"x{r.get('speedup_vs_fastvideo', float('nan')):.2f} vs FastVideo"
                  + (f" (rounds {min(rounds):.2f}-{max(rounds):.2f})" if rounds else "")
                  + (f", glue {r['profile']['glue_share'] * 100:.1f}%" if r.get("profile") else ""))
    print(f"results: {out}")
    if args.plot:
        print(f"plot: {plot(bench.rows, args.plot, args.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
