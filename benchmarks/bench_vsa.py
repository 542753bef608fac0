#!/usr/bin/env python
"""Block-sparse attention benchmark: library routes and peers side by side, in one run.

Routes (the public API, route picked per call by env vars read at call time):
  triton  FASTVIDEO_VSA_TRITON=1   -> fastvideo_cute.block_sparse_attn{,_128,_256}[_bshd]
  cute    FASTVIDEO_VSA_CUTEDSL=1  -> same functions; the route actually taken is recorded
  fa4 / cudnn / sm90  FASTVIDEO_VSA_BACKEND=<name> (sm90: our wgmma 64-token kernels, the forward
          also at 128/256-token blocks as the 64-token tiles that cover them, the warp-specialized
          backward at 64-token blocks, bf16, head_dim 128; what it cannot serve is recorded as an
          error with the reason)
  sm120   our mma.sync + TMA forward (FASTVIDEO_VSA_BACKEND=sm120), forward only, 128/256 blocks,
          one entry per kernel mode (--sm120-variants; default: the adapter's per-arch choice),
          through the op video_sparse_attn's sparse branch calls (no LSE), map_to_index included
Peers:
  sdpa-flash / sdpa-cudnn  torch SDPA, dense, with that backend forced (torch.nn.attention.sdpa_kernel)
  flex                     torch FlexAttention (compiled) with an equivalent BlockMask
  fa4-dense                flash_attn.cute.flash_attn_func, dense
  fa4-bsparse              raw FA4 block sparsity, metadata PREBUILT once by the adapter: kernel only

Effective FLOPs = 4 * B * H * D * selected_block_pairs * qblock * kvblock for the forward, and
2.5x that for the backward; "effective TF/s" divides those by each entry's time, dense peers
included, so one column compares everything. Each entry also carries the FLOPs its kernel
really does ("tflops": dense peers count the dense work).
Library routes are timed end to end (metadata build included); the metadata build is also
timed on its own ("metadata_ms"). Forward = inference (no grad); backward = the backward pass
only, of a forward that saved its graph. Times: triton.testing.do_bench (CUDA events, median).
Peers that cannot run here are recorded as skipped/error with the reason.

Examples (GPU box):
  python benchmarks/bench_vsa.py --smoke
  python benchmarks/bench_vsa.py --seqlens 32768 65536 --block-size 64 128 256 --sparsity 0.875 \
      --routes triton cute --peers sdpa-flash sdpa-cudnn flex fa4-dense fa4-bsparse --modes fwd bwd \
      --name h200_vsa --plot benchmarks/results/h200_vsa.png
  python benchmarks/bench_vsa.py --replot benchmarks/results/h200_vsa.json --plot out.png   # CPU is fine (.[bench])
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ROUTES = ("default", "triton", "cute", "fa4", "cudnn", "sm90", "sm120")
# "<route>-lists": the route through the *_from_indices API, fed the top-k q2k lists prebuilt (the
# form video_sparse_attn hands its sparse branch, and what the cuDNN BSA / FastVideo peers get).
LIST_ROUTES = tuple(f"{r}-lists" for r in ROUTES if r != "sm120")
PEERS = ("sdpa-flash", "sdpa-cudnn", "flex", "fa4-dense", "fa4-bsparse", "cudnn-bsa", "fastvideo", "fastvideo-triton")
# Peers whose kernel time a library route must match ("best peer"): block-sparse kernels with
# their metadata prebuilt, and FastVideo's own entry points.
SPARSE_PEERS = ("fa4-bsparse", "cudnn-bsa", "fastvideo", "fastvideo-triton", "flex")
MODES = ("fwd", "bwd")
BWD_FLOP_FACTOR = 2.5
ROUTE_VARS = ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND")
# route -> the variables that select it (default: none set; fa4/cudnn: the backend named)
ROUTE_ENV = {"default": {}, "triton": {"FASTVIDEO_VSA_TRITON": "1"}, "cute": {"FASTVIDEO_VSA_CUTEDSL": "1"},
             "fa4": {"FASTVIDEO_VSA_BACKEND": "fa4"}, "cudnn": {"FASTVIDEO_VSA_BACKEND": "cudnn"},
             "sm90": {"FASTVIDEO_VSA_BACKEND": "sm90"}}

# ---------------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench_vsa.py",
        description="Benchmark VSA block-sparse attention routes against dense and block-sparse peers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536],
                   help="sequence lengths (q = kv), each a multiple of every block size")
    p.add_argument("--block-size", type=int, nargs="+", default=[128], choices=[64, 128, 256],
                   help="logical block sizes (q and kv)")
    p.add_argument("--sparsity", type=float, nargs="+", default=[0.875],
                   help="fraction of kv blocks each q block skips; topk = round((1-s)*KVb), at least 1")
    p.add_argument("--routes", nargs="*", default=["triton", "cute"], choices=ROUTES + LIST_ROUTES,
                   help="library routes (sm120 is opt-in: on sm_90 it is a verification target); "
                        "<route>-lists calls the *_from_indices API with the top-k lists prebuilt")
    p.add_argument("--sm120-variants", nargs="+", default=None,
                   help="kernel modes the sm120 route runs, one entry each, sm120[<mode>] (w4r3, simple_split: "
                        "fastvideo_cute.adapters.cute_sm120.VARIANTS); default: the adapter's choice for the GPU, "
                        "as entry sm120")
    p.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    p.add_argument("--layout", default="bhsd", choices=["bhsd", "bshd"],
                   help="layout handed to the library API (bshd uses the *_bshd functions)")
    p.add_argument("--ragged", action="store_true",
                   help="make the last kv block partial (size block//2 + 1) instead of all full")
    p.add_argument("--grid", type=int, nargs=3, default=None, metavar=("T", "H", "W"),
                   help="a real model latent grid instead of --seqlens: tiled with --tile (partial edge tiles)")
    p.add_argument("--tile", type=int, nargs=3, action="append", default=None, metavar=("TT", "TH", "TW"),
                   help="VSA tile(s) for --grid (its product is the block size; repeat for several)")
    p.add_argument("--write-route-table", default=None, metavar="PATH",
                   help="write the measured route table (the backends ranked per call class) to PATH")
    p.add_argument("--warmup", type=int, default=25, help="do_bench warmup, ms")
    p.add_argument("--rep", type=int, default=100, help="do_bench repetition time, ms")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every entry of a case this many times, interleaved (routes then peers, "
                        "round after round), and report the median: run-to-run drift hits every entry alike")
    p.add_argument("--settle", type=float, default=0.5,
                   help="seconds between two entries, after a device sync and torch.cuda.empty_cache(), so that "
                        "no entry inherits the one before it (H100 tables v30-v38: the entry run right after "
                        "FastVideo's was 3 %% slower on average, up to 28 %% in one round; 0 turns it off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default=None, help="result name (default: vsa_<gpu>_<time>)")
    p.add_argument("--out", default=None, help="JSON path (default: benchmarks/results/<name>.json)")
    p.add_argument("--plot", default=None,
                   help="PNG path for an effective-TF/s chart (needs matplotlib: install .[bench])")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes and short timing, for a quick end-to-end check")
    p.add_argument("--replot", default=None, metavar="JSON",
                   help="no benchmark: redraw --plot from an existing results JSON (works on CPU; needs "
                        "matplotlib: install .[bench])")
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    if args.smoke:
        args.seqlens = [2048]
        args.heads = min(args.heads, 2)
        args.batch = 1
        args.warmup, args.rep = 2, 10
        if args.name is None:
            args.name = "smoke"
    if args.replot is not None:
        if not args.plot:
            p.error("--replot needs --plot")
        return args
    for s in args.sparsity:
        if not 0.0 <= s < 1.0:
            p.error(f"--sparsity values must be in [0, 1), got {s}")
    if args.grid is not None:
        if not args.tile:
            p.error("--grid needs --tile")
        for tile in args.tile:
            if math.prod(tile) not in (64, 128, 256):
                p.error(f"--tile {tile}: the product must be 64, 128 or 256")
    for n in args.seqlens:
        for bs in args.block_size:
            if n % bs:
                p.error(f"--seqlens {n} is not a multiple of --block-size {bs}")
    if args.batch < 1 or args.heads < 1 or args.head_dim < 1:
        p.error("--batch, --heads and --head-dim must be positive")
    return args


# ---------------------------------------------------------------------------------------------
# FLOPs, ratios, environment
# ---------------------------------------------------------------------------------------------


def topk_for(sparsity: float, kv_blocks: int) -> int:
    return max(1, min(kv_blocks, int(round((1.0 - sparsity) * kv_blocks))))


def sparse_flops(head_dim: int, selected_pairs: int, q_block: int, kv_block: int, mode: str) -> float:
    """Effective FLOPs: 4 * D * selected_pairs * qblock * kvblock, ``selected_pairs`` summed over
    all (batch, head), i.e. 4*B*H*D*(pairs per head)*qblock*kvblock; the backward counts 2.5x."""
    f = 4.0 * head_dim * selected_pairs * q_block * kv_block
    return f * BWD_FLOP_FACTOR if mode == "bwd" else f


def case_flops(batch, heads, head_dim, q_blocks, topk, block, mode) -> float:
    """Effective FLOPs of one case: every (b, h, q block) selects exactly ``topk`` kv blocks."""
    return sparse_flops(head_dim, batch * heads * q_blocks * topk, block, block, mode)


def dense_flops(batch, heads, head_dim, sq, skv, mode) -> float:
    f = 4.0 * batch * heads * head_dim * sq * skv
    return f * BWD_FLOP_FACTOR if mode == "bwd" else f


def tflops(flops: float, ms: Optional[float]) -> Optional[float]:
    if not ms or ms <= 0:
        return None
    return flops / (ms * 1e-3) / 1e12


def group_key(r: dict) -> tuple:
    return (r["mode"], r["seqlen"], r["block_size"], r["sparsity"], tuple(r.get("grid") or ()))


def merge_rounds(results: List[dict]) -> List[dict]:
    """One record per (entry, case) from ``--rounds`` interleaved measurements: the first round's
    record with ``ms`` (and its TF/s) the median of the rounds that ran ok, every round's ms in
    ``ms_rounds``. An entry that failed or was skipped in any round keeps that round's record."""
    merged: Dict[tuple, List[dict]] = {}
    order: List[tuple] = []
    for r in results:
        key = (r["kind"], r["name"]) + group_key(r)
        if key not in merged:
            merged[key] = []
            order.append(key)
        merged[key].append(r)
    out = []
    for key in order:
        rows = merged[key]
        bad = [r for r in rows if r["status"] != "ok" or not r.get("ms")]
        if bad or len(rows) == 1:
            out.append(bad[0] if bad else rows[0])
            continue
        times = sorted(r["ms"] for r in rows)
        n = len(times)
        med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
        r = dict(rows[0])
        r["ms"], r["ms_rounds"] = med, [x["ms"] for x in rows]
        if any("after" in x for x in rows):
            r["after_rounds"] = [x.get("after") for x in rows]
        r.pop("after", None)
        r["tflops"], r["effective_tflops"] = tflops(r["flops"], med), tflops(r["effective_flops"], med)
        out.append(r)
    return out


def add_ratios(results: List[dict]) -> None:
    """For every ok route entry: ``vs`` = {other entry name: other_ms / this_ms} within its case
    (same mode, seqlen, block size, sparsity). > 1 means this route is faster."""
    groups: Dict[tuple, List[dict]] = {}
    for r in results:
        groups.setdefault(group_key(r), []).append(r)
    for rows in groups.values():
        for r in rows:
            if r["kind"] != "route" or r["status"] != "ok":
                continue
            r["vs"] = {o["name"]: o["ms"] / r["ms"] for o in rows
                       if o is not r and o["status"] == "ok" and o.get("ms")}


def _version(dist: str) -> Optional[str]:
    try:
        import importlib.metadata as md

        return md.version(dist)
    except Exception:
        return None


def _module_version(name: str) -> Optional[str]:
    try:
        mod = __import__(name)
        return getattr(mod, "__version__", None)
    except Exception:
        return None


def environment() -> dict:
    env = {
        "python": platform.python_version(),
        "host": platform.node(),
        "torch": _module_version("torch"),
        "triton": _module_version("triton") or _version("triton"),
        "nvidia-cutlass-dsl": _version("nvidia-cutlass-dsl"),
        "flash-attn-4": _version("flash-attn-4"),
        "quack-kernels": _version("quack-kernels"),
        "fastvideo-cute": _version("fastvideo-cute"),
        "nvidia-cudnn-frontend": _version("nvidia-cudnn-frontend"),
        "fastvideo-kernel": _version("fastvideo-kernel"),
    }
    try:
        # The device copy of the tree has no git history: the caller passes the commit in FVC_COMMIT.
        env["git_commit"] = os.environ.get("FVC_COMMIT") or subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        env["git_dirty"] = bool(dirty)
    except Exception:
        env["git_commit"] = None
    try:
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name()
            env["capability"] = list(torch.cuda.get_device_capability())
            env["cuda"] = torch.version.cuda
            env["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
    except Exception:
        pass
    return env


def default_name(env: dict) -> str:
    gpu = (env.get("gpu") or "cpu").lower()
    slug = "".join(c if c.isalnum() else "_" for c in gpu).strip("_")
    return f"vsa_{slug}_{_dt.datetime.now().strftime('%Y%m%d_%H%M%S')}"


# ---------------------------------------------------------------------------------------------
# writers
# ---------------------------------------------------------------------------------------------


def write_json(payload: dict, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    return path


# One colour per entry (route, sm120 variant or peer), the same in every panel and every chart:
# a fixed table, so a panel missing an entry does not shift the others' colours.
ENTRY_COLOURS = {
    # library routes
    "default": "#000000",
    "triton": "#1f77b4",
    "cute": "#d62728",
    "fa4": "#ad494a",
    "cudnn": "#6b6ecf",
    "sm90": "#393b79",  # our wgmma 64-token forward
    "default-lists": "#1f3b73",  # the default route fed q2k lists (*_from_indices)
    "cute-lists": "#6b6ecf",
    "sm120": "#2ca02c",  # the sm120 route's "simple" variant
    # the sm120 route's other kernel variants (--sm120-variants)
    "sm120[simple_split]": "#98df8a",
    "sm120[w4]": "#9edae5",
    "sm120[w4i]": "#ff9896",
    "sm120[w4i_nophase]": "#c5b0d5",
    "sm120[w4i_split]": "#c49c94",
    "sm120[w4r]": "#bcbd22",
    "sm120[w4r_nophase]": "#dbdb8d",
    "sm120[w4r2]": "#ffbb78",
    "sm120[w4r3]": "#17becf",
    "sm120[ws]": "#f7b6d2",
    # peers
    "sdpa-flash": "#7f7f7f",
    "sdpa-cudnn": "#8c564b",
    "flex": "#9467bd",
    "fa4-dense": "#ff7f0e",
    "fa4-bsparse": "#e377c2",
    "cudnn-bsa": "#b5cf6b",
    "fastvideo": "#e7ba52",
    "fastvideo-triton": "#de9ed6",
}
# Entries the table does not name (a new variant or peer): a colour picked by a stable hash of the name.
_SPARE_COLOURS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")
BENCH_INSTALL_HINT = "install .[bench] (pip install 'fastvideo-cute[bench]')"


def entry_colour(name: str) -> str:
    """The fixed colour of an entry (its record's ``name``), whichever panel or chart it is in."""
    import zlib

    return ENTRY_COLOURS.get(name) or _SPARE_COLOURS[zlib.crc32(name.encode()) % len(_SPARE_COLOURS)]


def _label(r: dict) -> str:
    """The legend label: the entry's name, plus the backend that served a route when it is not
    the one the name says (``cute->fa4``, ``cute->triton``; ``sm120[w4r3]`` stays as it is)."""
    name = r["name"]
    served = r.get("served_by")
    if r["kind"] == "route" and served and served != name.split("[")[0]:
        name = f"{name}->{served}"
    return name


def _import_pyplot():
    """``matplotlib.pyplot`` on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _panels(rows: List[dict]) -> List[tuple]:
    return sorted({(r["mode"], r["seqlen"], r["block_size"]) for r in rows},
                  key=lambda p: (MODES.index(p[0]) if p[0] in MODES else 9, p[1], p[2]))


def build_figure(payload: dict, plt):
    """Grouped bars: effective TF/s by entry (routes and peers) and sparsity; one panel per
    (mode, seqlen, block size); each entry in its :func:`entry_colour`. None if nothing succeeded."""
    rows = [r for r in payload["results"] if r["status"] == "ok" and r.get("effective_tflops")]
    panels = _panels(rows)
    if not panels:
        return None
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.2 * ncols, 4.2 * nrows), squeeze=False)
    for ax, (mode, seqlen, block) in zip(axes.flat, panels):
        sel = [r for r in rows if (r["mode"], r["seqlen"], r["block_size"]) == (mode, seqlen, block)]
        sparsities = sorted({r["sparsity"] for r in sel})
        entry = {}  # label -> entry name, in first-seen order
        for r in sel:
            entry.setdefault(_label(r), r["name"])
        labels = list(entry)
        width = 0.8 / max(1, len(labels))
        for i, lab in enumerate(labels):
            ys = []
            for s in sparsities:
                hit = [r["effective_tflops"] for r in sel if _label(r) == lab and r["sparsity"] == s]
                ys.append(hit[0] if hit else 0.0)
            xs = [j + (i - (len(labels) - 1) / 2) * width for j in range(len(sparsities))]
            bars = ax.bar(xs, ys, width, label=lab, color=entry_colour(entry[lab]))
            for bar, y in zip(bars, ys):
                if y:
                    ax.annotate(f"{y:.0f}", (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom",
                                fontsize=7)
        # A dense peer's bar is its effective TF/s (the sparse work over its time); its own
        # throughput (the dense work over its time, the kernel-efficiency yardstick) is a dashed
        # line in the entry's colour.
        for r in sel:
            if r.get("dense") and r.get("tflops"):
                ax.axhline(r["tflops"], ls="--", lw=0.8, color=entry_colour(r["name"]))
                ax.annotate(f"{_label(r)} own TF/s {r['tflops']:.0f}", (ax.get_xlim()[1], r["tflops"]),
                            fontsize=7, va="top", ha="right", color="0.3")
        ax.set_xticks(range(len(sparsities)))
        ax.set_xticklabels([f"{s:g}" for s in sparsities])
        ax.set_xlabel("sparsity")
        ax.set_ylabel("effective TF/s")
        ax.set_title(f"{mode}  S={seqlen}  block={block}")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    env = payload.get("env", {})
    cfg = payload.get("config", {})
    fig.suptitle(f"{env.get('gpu', '?')}  B={cfg.get('batch')} H={cfg.get('heads')} D={cfg.get('head_dim')} "
                 f"{cfg.get('dtype')}  commit {str(env.get('git_commit'))[:10]}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_results(payload: dict, path) -> Optional[Path]:
    """Draw :func:`build_figure` into the PNG ``path``. Returns the path, or None (with the
    reason printed) without matplotlib or without a successful entry."""
    plt = _import_pyplot()
    if plt is None:
        print(f"[plot] matplotlib is not installed; skipping the chart ({BENCH_INSTALL_HINT}, "
              "then redraw it with --replot)")
        return None
    fig = build_figure(payload, plt)
    if fig is None:
        print("[plot] no successful entries to plot")
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def replot(json_path, png_path) -> int:
    """``--replot``: redraw a chart from a results JSON. Fails (exit status 1, message on stderr)
    without matplotlib, for an unreadable JSON, or when no entry succeeded."""
    if _import_pyplot() is None:
        raise SystemExit(f"bench_vsa.py --replot: matplotlib is not installed: {BENCH_INSTALL_HINT}")
    try:
        payload = json.loads(Path(json_path).read_text())
        payload["results"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"bench_vsa.py --replot: cannot read results from {json_path}: {type(e).__name__}: {e}")
    out = plot_results(payload, png_path)
    if out is None:
        raise SystemExit(f"bench_vsa.py --replot: no successful entries in {json_path}; no chart written")
    print(f"plot: {out}")
    return 0


def summarize(results: List[dict]) -> List[dict]:
    """Per call class (mode, S, block, sparsity, grid): the best library route, the best
    block-sparse peer (``SPARSE_PEERS``), and best route time / best peer time as ``speedup``
    (> 1: the library is faster). ``overhead`` compares each named-backend route with the same
    backend's raw kernel entry (fa4 vs fa4-bsparse, cudnn vs cudnn-bsa): route ms / kernel ms - 1."""
    groups: Dict[tuple, List[dict]] = {}
    for r in results:
        if r["status"] == "ok" and r.get("ms"):
            groups.setdefault(group_key(r), []).append(r)
    rows = []
    for key, rs in groups.items():
        routes = [r for r in rs if r["kind"] == "route" and not r["name"].startswith("sm120")]
        peers = [r for r in rs if r["kind"] == "peer" and r["name"] in SPARSE_PEERS]
        if not routes:
            continue
        best_r = min(routes, key=lambda r: r["ms"])
        row = {"mode": key[0], "seqlen": key[1], "block_size": key[2], "sparsity": key[3], "grid": key[4],
               "tiles": best_r.get("tiles"), "best_route": best_r["name"], "best_route_ms": best_r["ms"],
               "best_route_served_by": best_r.get("served_by")}
        if peers:
            best_p = min(peers, key=lambda r: r["ms"])
            row.update(best_peer=best_p["name"], best_peer_ms=best_p["ms"], speedup=best_p["ms"] / best_r["ms"])
        by_name = {r["name"]: r for r in rs}
        row["overhead"] = {route: by_name[route]["ms"] / by_name[raw]["ms"] - 1 for route, raw in
                           (("fa4", "fa4-bsparse"), ("cudnn", "cudnn-bsa")) if route in by_name and raw in by_name}
        for route in ("default", "cute", "default-lists"):
            if route in by_name:
                row[f"{route}_ms"] = by_name[route]["ms"]
        rows.append(row)
    return rows


def print_summary(rows: List[dict]) -> None:
    print("\nsummary: best library route / best peer (block-sparse kernels, metadata prebuilt) per call class")
    for s in rows:
        where = f"grid={s['grid']}" if s.get("grid") else f"S={s['seqlen']}"
        peer = (f"{s['best_peer']} {s['best_peer_ms']:.3f} ms -> x{s['speedup']:.3f}" if "best_peer" in s
                else "no peer")
        ovh = " ".join(f"{k} overhead {v * 100:+.1f}%" for k, v in s.get("overhead", {}).items())
        print(f"  {s['mode']} {where} blk={s['block_size']} {s['tiles']}: {s['best_route']}"
              f"[{s.get('best_route_served_by')}] {s['best_route_ms']:.3f} ms vs {peer}  {ovh}")


def print_table(results: List[dict]) -> None:
    hdr = (f"{'mode':4} {'S':>6} {'blk':>4} {'spars':>6} {'entry':24} {'ms':>9} {'meta ms':>8} "
           f"{'eff TF/s':>9} {'TF/s':>7}  note")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        ms = f"{r['ms']:.3f}" if r.get("ms") else "-"
        meta = f"{r['metadata_ms']:.3f}" if r.get("metadata_ms") else "-"
        eff = f"{r['effective_tflops']:.1f}" if r.get("effective_tflops") else "-"
        own = f"{r['tflops']:.1f}" if r.get("tflops") else "-"
        note = r.get("reason") or ""
        if r.get("vs"):
            note = " ".join(f"x{v:.2f} vs {k}" for k, v in r["vs"].items())
        print(f"{r['mode']:4} {r['seqlen']:>6} {r['block_size']:>4} {r['sparsity']:>6g} {_label(r):24} {ms:>9} "
              f"{meta:>8} {eff:>9} {own:>7}  {r['status'] if r['status'] != 'ok' else ''}{note[:160]}")


# ---------------------------------------------------------------------------------------------
# measurement (GPU)
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _env(values: Dict[str, str], clear: Iterable[str] = ()):
    """Set ``values`` and unset ``clear`` for the duration; restore everything afterwards."""
    saved = {k: os.environ.get(k) for k in (*values, *clear)}
    try:
        for k in clear:
            os.environ.pop(k, None)
        os.environ.update(values)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _route_env(route: str):
    return _env(ROUTE_ENV[route.removesuffix("-lists")], clear=ROUTE_VARS)


class Case:
    """One (seqlen, block size, sparsity) problem: inputs, block map, sizes."""

    def __init__(self, args, seqlen: int, block: int, sparsity: float, device: str, tile=None):
        import torch

        self.grid = tuple(args.grid) if tile is not None else None
        self.tile = tuple(tile) if tile is not None else None
        if tile is not None:
            from fastvideo_cute.tiling import padded_length

            block, seqlen = math.prod(tile), padded_length(self.grid, self.tile)
        self.args, self.seqlen, self.block, self.sparsity = args, seqlen, block, sparsity
        self.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
        b, h, d = args.batch, args.heads, args.head_dim
        self.nblocks = seqlen // block
        self.topk = topk_for(sparsity, self.nblocks)
        g = torch.Generator(device=device).manual_seed(args.seed + seqlen + block)
        self.q, self.k, self.v = (torch.randn(b, h, seqlen, d, device=device, dtype=self.dtype, generator=g)
                                  for _ in range(3))
        self.dout = torch.randn(b, h, seqlen, d, device=device, dtype=self.dtype, generator=g)
        scores = torch.rand(b, h, self.nblocks, self.nblocks, device=device, generator=g)
        selected = scores.topk(self.topk, dim=-1).indices
        self.block_map = torch.zeros(b, h, self.nblocks, self.nblocks, dtype=torch.bool, device=device)
        self.block_map.scatter_(-1, selected, True)
        # The same selection as q2k lists, width topk (what video_sparse_attn's top-k gives).
        self.q2k_idx = selected.to(torch.int32)
        self.q2k_num = torch.full((b, h, self.nblocks), self.topk, dtype=torch.int32, device=device)
        self.sizes = torch.full((self.nblocks,), block, dtype=torch.int32, device=device)
        if args.ragged:
            self.sizes[-1] = block // 2 + 1
        if tile is not None:
            from fastvideo_cute.tiling import variable_block_sizes

            self.sizes = variable_block_sizes(self.grid, self.tile, device=device)
        # Padding slots hold zeros, as fastvideo_cute.to_tiles writes them (peers assume that).
        valid = (torch.arange(block, device=device)[None, :] < self.sizes[:, None]).reshape(1, 1, -1, 1)
        for t in (self.q, self.k, self.v):
            t.mul_(valid)
        self.all_full = bool((self.sizes == block).all())
        self.flops = {m: case_flops(b, h, d, self.nblocks, self.topk, block, m) for m in MODES}
        self.dense_flops = {m: dense_flops(b, h, d, seqlen, seqlen, m) for m in MODES}

    def bshd(self, t):
        return t.transpose(1, 2).contiguous()


class Runner:
    def __init__(self, args):
        import torch

        self.args = args
        self.torch = torch
        self.results: List[dict] = []
        self._dense_cache: Dict[tuple, dict] = {}

    # -- timing -----------------------------------------------------------------------------
    def bench(self, fn: Callable, grad_to_none=None) -> float:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=self.args.warmup, rep=self.args.rep, grad_to_none=grad_to_none))

    def record(self, case: Case, kind: str, name: str, mode: str, status: str, *, ms=None, metadata_ms=None,
               reason=None, dense=False, served_by=None, extra=None) -> dict:
        eff = case.flops[mode]
        own = case.dense_flops[mode] if dense else eff
        r = {
            "kind": kind, "name": name, "mode": mode, "seqlen": case.seqlen, "block_size": case.block,
            "sparsity": case.sparsity, "topk": case.topk, "kv_blocks": case.nblocks,
            "density": case.topk / case.nblocks,
            "selected_block_pairs": self.args.batch * self.args.heads * case.nblocks * case.topk,
            "grid": list(case.grid) if case.grid else None, "tile": list(case.tile) if case.tile else None,
            "tiles": "full" if case.all_full else "partial", "head_dim": self.args.head_dim,
            "status": status, "reason": reason, "ms": ms, "metadata_ms": metadata_ms, "dense": dense,
            "flops": own, "effective_flops": eff, "tflops": tflops(own, ms), "effective_tflops": tflops(eff, ms),
        }
        if served_by is not None:
            r["served_by"] = served_by
        if extra:
            r.update(extra)
        self.results.append(r)
        tag = f"{ms:.3f} ms" if ms else (reason or "")
        print(f"  [{kind}] {name:12s} {mode} S={case.seqlen} blk={case.block} s={case.sparsity:g}: {status} {tag}",
              flush=True)
        return r

    def guarded(self, case: Case, kind: str, name: str, mode: str, fn: Callable[[], dict]) -> None:
        try:
            out = fn()
        except _Skip as s:
            self.record(case, kind, name, mode, "skipped", reason=str(s))
            return
        except Exception as e:  # record, keep going
            msg = f"{type(e).__name__}: {e}".splitlines()[0][:400]
            print(traceback.format_exc(limit=3), file=sys.stderr)
            self.record(case, kind, name, mode, "error", reason=msg)
            return
        finally:
            self.torch.cuda.empty_cache()
        self.record(case, kind, name, mode, "ok", **out)

    # -- library routes -----------------------------------------------------------------------
    def _api(self, block: int, lists: bool = False):
        """The public function a route entry calls; with ``lists`` the ``*_from_indices`` one."""
        import fastvideo_cute as fc

        suffix = ("_bshd" if self.args.layout == "bshd" else "") + ("_from_indices" if lists else "")
        base = {64: "block_sparse_attn", 128: "block_sparse_attn_128", 256: "block_sparse_attn_256"}[block]
        return getattr(fc, base + suffix)

    @staticmethod
    def _observe(fn):
        """Run ``fn`` once and return the backend the ops dispatched to (from their counter)."""
        from fastvideo_cute import ops

        before = ops.dispatch_counts.copy()
        fn()
        ran = sorted({name for (name, _), n in ops.dispatch_counts.items() if n != before[(name, _)]})
        return "+".join(ran) if ran else None

    def _metadata_ms(self, route: str, served_by: Optional[str], case: Case, mode: str) -> Optional[float]:
        """Time of the metadata build the route does inside the call (approximate for Triton)."""
        try:
            if served_by == "fa4" or (served_by is None and route == "cute"):
                from fastvideo_cute.adapters import fa4 as A

                arch = A.fa4_arch()
                if mode == "fwd":
                    plan = A.fa4_fwd_plan(arch, case.block)
                    return self.bench(lambda: A.build_fwd_metadata(case.block_map, case.sizes, plan))
                plan = A.fa4_bwd_plan(arch, case.block)
                return self.bench(lambda: A.build_bwd_metadata(case.block_map, case.sizes, plan))
            from fastvideo_cute.metadata import map_to_index

            if mode == "fwd":
                return self.bench(lambda: map_to_index(case.block_map))
            return self.bench(lambda: map_to_index(case.block_map.transpose(-1, -2).contiguous()))
        except Exception:
            return None

    def run_sm120(self, case: Case, mode: str) -> None:
        """The sm120 route, one entry per kernel variant: the library op with need_lse=False (what
        video_sparse_attn's sparse branch calls), backend named, so nothing falls back silently."""
        torch = self.torch
        for variant in self.args.sm120_variants or [None]:
            def go(variant=variant):
                if mode != "fwd":
                    raise _Skip("inference only (no backward)")
                if case.block not in (128, 256):
                    raise _Skip("128- and 256-token blocks only")
                from fastvideo_cute.adapters.cute_sm120 import default_variant, sm120_arch
                from fastvideo_cute.ops import block_sparse_attn_op
                from fastvideo_cute.validation import check_block_sizes

                bshd = self.args.layout == "bshd"
                # What video_sparse_attn does before the op: the (cached) range check, which also
                # records whether every block is full (the sm120 backend serves only that case).
                check_block_sizes(case.sizes, case.nblocks, case.block, case.sizes.device)
                q, k, v = (case.bshd(t) if bshd else t for t in (case.q, case.k, case.v))
                env = {"FASTVIDEO_VSA_CUTEDSL": "1", "FASTVIDEO_VSA_BACKEND": "sm120"}
                if variant is not None:
                    env["FASTVIDEO_CUTE_SM120_KERNEL"] = variant
                with _env(env, clear=(*ROUTE_ENV.values(), "FASTVIDEO_CUTE_SM120_KERNEL")):
                    ran = default_variant(sm120_arch(q.device))
                    call = lambda: block_sparse_attn_op(q, k, v, case.block_map, case.sizes, block_size=case.block,
                                                         bshd=bshd, sm_scale=q.shape[-1] ** -0.5, need_lse=False)
                    with torch.no_grad():
                        ms = self.bench(call)
                meta = self._metadata_ms("sm120", "sm120", case, mode)  # map_to_index
                return {"ms": ms, "metadata_ms": meta, "served_by": "sm120", "extra": {"variant": ran}}

            self.guarded(case, "route", "sm120" if variant is None else f"sm120[{variant}]", mode, go)

    def run_route(self, route: str, case: Case, mode: str) -> None:
        torch = self.torch

        def go():
            lists = route.endswith("-lists")
            api = self._api(case.block, lists)
            fn = (lambda q, k, v: api(q, k, v, case.q2k_idx, case.q2k_num, case.sizes)) if lists else \
                (lambda q, k, v: api(q, k, v, case.block_map, case.sizes))
            bshd = self.args.layout == "bshd"
            q, k, v = (case.bshd(t) if bshd else t for t in (case.q, case.k, case.v))
            with _route_env(route):
                if mode == "fwd":
                    with torch.no_grad():
                        call = lambda: fn(q, k, v)  # noqa: E731
                        served = self._observe(call)
                        ms = self.bench(call)
                else:
                    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
                    out, _ = fn(q, k, v)
                    dout = case.bshd(case.dout) if bshd else case.dout
                    call = lambda: torch.autograd.backward(out, dout, retain_graph=True)  # noqa: E731
                    served = self._observe(call)
                    ms = self.bench(call, grad_to_none=[q, k, v])
                # The lists arrive prebuilt, as the list-taking peers' do (their build is not timed).
                meta = None if lists else self._metadata_ms(route, served, case, mode)
            return {"ms": ms, "metadata_ms": meta, "served_by": served, "extra": {"api": "lists" if lists else "map"}}

        self.guarded(case, "route", route, mode, go)

    # -- peers --------------------------------------------------------------------------------
    def run_peer(self, peer: str, case: Case, mode: str) -> None:
        if peer in ("sdpa-flash", "sdpa-cudnn", "fa4-dense"):
            key = (peer, mode, case.seqlen)
            if key in self._dense_cache:  # dense work does not depend on block size or sparsity
                cached = self._dense_cache[key]
                self.record(case, "peer", peer, mode, cached["status"], ms=cached.get("ms"),
                            reason=cached.get("reason"), dense=True, extra={"shared_dense_measurement": True})
                return
            n0 = len(self.results)
            self.guarded(case, "peer", peer, mode, lambda: {**getattr(self, "_" + peer.replace("-", "_"))(case, mode),
                                                            "dense": True})
            if len(self.results) > n0:
                self._dense_cache[key] = self.results[-1]
            return
        self.guarded(case, "peer", peer, mode, lambda: getattr(self, "_" + peer.replace("-", "_"))(case, mode))

    def _dense_run(self, case: Case, mode: str, call: Callable, q, k, v, dout) -> dict:
        torch = self.torch
        if mode == "fwd":
            with torch.no_grad():
                return {"ms": self.bench(lambda: call(q, k, v))}
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        out = call(q, k, v)
        out = out[0] if isinstance(out, tuple) else out
        return {"ms": self.bench(lambda: torch.autograd.backward(out, dout, retain_graph=True),
                                 grad_to_none=[q, k, v])}

    def _sdpa(self, case: Case, mode: str, backend_name: str) -> dict:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        with sdpa_kernel(backend):
            return self._dense_run(case, mode, lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                                   case.q, case.k, case.v, case.dout)

    def _sdpa_flash(self, case, mode):
        return self._sdpa(case, mode, "FLASH_ATTENTION")

    def _sdpa_cudnn(self, case, mode):
        return self._sdpa(case, mode, "CUDNN_ATTENTION")

    def _fa4_dense(self, case, mode):
        try:
            from flash_attn.cute import flash_attn_func
        except ImportError as e:
            raise _Skip(f"flash_attn.cute not importable: {e}")
        q, k, v, dout = (case.bshd(t) for t in (case.q, case.k, case.v, case.dout))
        return self._dense_run(case, mode, lambda a, b, c: flash_attn_func(a, b, c), q, k, v, dout)

    def _fa4_bsparse(self, case, mode):
        try:
            from fastvideo_cute.adapters import fa4 as A

            A.load_fa4()
        except ImportError as e:
            raise _Skip(f"FA4 not importable: {str(e).splitlines()[0]}")
        arch = A.fa4_arch()
        ok, why = A.fa4_support(arch, case.dtype, self.args.head_dim, case.block, case.block, mode == "bwd")
        if not ok:
            raise _Skip(why)
        q, k, v, dout = (case.bshd(t) for t in (case.q, case.k, case.v, case.dout))
        fplan = A.fa4_fwd_plan(arch, case.block)
        fmeta = A.build_fwd_metadata(case.block_map, case.sizes, fplan)
        if mode == "fwd":
            ms = self.bench(lambda: A.fa4_block_sparse_fwd_prebuilt(q, k, v, fmeta))
            meta_ms = self.bench(lambda: A.build_fwd_metadata(case.block_map, case.sizes, fplan))
            return {"ms": ms, "metadata_ms": meta_ms, "extra": {"plan": fplan._asdict()}}
        out, lse = A.fa4_block_sparse_fwd_prebuilt(q, k, v, fmeta)
        bplan = A.fa4_bwd_plan(arch, case.block)
        bmeta = A.build_bwd_metadata(case.block_map, case.sizes, bplan)
        ms = self.bench(lambda: A.fa4_block_sparse_bwd_prebuilt(q, k, v, out, dout, lse, bmeta))
        meta_ms = self.bench(lambda: A.build_bwd_metadata(case.block_map, case.sizes, bplan))
        return {"ms": ms, "metadata_ms": meta_ms, "extra": {"plan": bplan._asdict()}}

    def _fastvideo_call(self, case, mode, force_triton: bool) -> dict:
        """FastVideo's block_sparse_attn_from_indices with its index lists prebuilt (the kernel
        it dispatches to: ThunderKittens on sm_90 when its extension loads, else Triton)."""
        fvk = _import_fastvideo()
        if case.block != 64:
            raise _Skip("fastvideo-kernel's block_sparse_attn serves 64-token blocks")
        from fastvideo_cute.metadata import map_to_index

        idx, num = map_to_index(case.block_map)
        tk = sys.modules["fastvideo_kernel.block_sparse_attn"]._get_sm90_ops()[0] is not None and not force_triton
        path = "tk" if tk and sys.modules["fastvideo_kernel.block_sparse_attn"]._is_sm90() else "triton"
        env = {"FASTVIDEO_VSA_TRITON": "1"} if force_triton else {}
        with _env(env, clear=("FASTVIDEO_VSA_TRITON", "FASTVIDEO_KERNEL_VSA_FORCE_TRITON", "FASTVIDEO_VSA_TK")):
            call = lambda a, b, c: fvk.block_sparse_attn_from_indices(a, b, c, idx, num, case.sizes)  # noqa: E731
            out = self._dense_run(case, mode, call, case.q, case.k, case.v, case.dout)
        out["extra"] = {"fastvideo_path": path, "fastvideo_C_loaded": sys.modules["fastvideo_kernel.block_sparse_attn"]._get_sm90_ops()[0]
                        is not None}
        return out

    def _fastvideo(self, case, mode):
        return self._fastvideo_call(case, mode, force_triton=False)

    def _fastvideo_triton(self, case, mode):
        return self._fastvideo_call(case, mode, force_triton=True)

    def _cudnn_bsa(self, case, mode):
        """cuDNN-frontend BSA through our adapter with its metadata prebuilt (the kernel plus the
        padding pass the adapter needs when a tile is partial)."""
        try:
            from fastvideo_cute.adapters import cudnn_bsa as C

            C.load_cudnn()
        except ImportError as e:
            raise _Skip(f"cuDNN-frontend not importable: {str(e).splitlines()[0]}")
        from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
        from fastvideo_cute.adapters.cudnn_bsa_support import cudnn_support
        from fastvideo_cute.metadata import map_to_index

        torch = self.torch
        bshd = self.args.layout == "bshd"
        b, h, d = self.args.batch, self.args.heads, self.args.head_dim
        ok, why = cudnn_support(torch.cuda.get_device_capability(), case.dtype, d, case.block, mode == "bwd",
                                q_len=case.seqlen, kv_len=case.seqlen, heads_q=h, heads_kv=h, bshd=bshd,
                                kv_all_full=case.all_full)
        if not ok:
            raise _Skip(why)
        q, k, v, dout = ((case.bshd(t) if bshd else t) for t in (case.q, case.k, case.v, case.dout))
        idx, num = map_to_index(case.block_map)
        meta = build_cudnn_metadata(idx, num, case.sizes, block_size=case.block, batch=b, heads=h, q_len=case.seqlen,
                                    kv_len=case.seqlen, all_full=case.all_full)
        # The inputs' padding holds zeros (Case), so the kernel alone is exact here: no sanitizing copy.
        if mode == "fwd":
            ms = self.bench(lambda: C.cudnn_fwd_prebuilt(q, k, v, meta, bshd=bshd, softmax_scale=None))
            return {"ms": ms, "extra": {"sparse_block": meta.sparse_block}}
        out, lse = C.cudnn_fwd_prebuilt(q, k, v, meta, bshd=bshd, softmax_scale=None)
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        ms = self.bench(lambda: C.cudnn_bwd_prebuilt(dout, q, k, v, out, lse, meta, bshd=bshd, softmax_scale=None,
                                                     dq=dq, dk=dk, dv=dv))
        return {"ms": ms, "extra": {"sparse_block": meta.sparse_block}}

    def _flex(self, case, mode):
        torch = self.torch
        try:
            from torch.nn.attention.flex_attention import BlockMask, flex_attention
        except ImportError as e:
            raise _Skip(f"FlexAttention not available in torch {torch.__version__}: {e}")
        from fastvideo_cute.metadata import map_to_index

        blk = case.block
        full_sizes = case.sizes == blk
        full_map = case.block_map & full_sizes.view(1, 1, 1, -1)
        part_map = case.block_map & (~full_sizes & (case.sizes > 0)).view(1, 1, 1, -1)
        f_idx, f_cnt = map_to_index(full_map)
        p_idx, p_cnt = map_to_index(part_map)
        sizes = case.sizes

        def valid_len_mask(b, h, q_idx, kv_idx):
            return (kv_idx % blk) < sizes[kv_idx // blk]

        block_mask = BlockMask.from_kv_blocks(p_cnt, p_idx, f_cnt, f_idx, BLOCK_SIZE=(blk, blk),
                                              mask_mod=valid_len_mask, seq_lengths=(case.seqlen, case.seqlen))
        compiled = torch.compile(flex_attention, dynamic=False)
        kernel_options = {"BLOCK_M": 64, "BLOCK_N": 64} if blk == 64 else None

        def call(q, k, v):
            return compiled(q, k, v, block_mask=block_mask, kernel_options=kernel_options)

        return self._dense_run(case, mode, call, case.q, case.k, case.v, case.dout)


class _Skip(Exception):
    pass


def _import_fastvideo():
    """fastvideo-kernel, with lazy symbol binding: its ThunderKittens extension was built for
    torch 2.12 and loads on the device's torch only that way (one unused NCCL symbol is missing)."""
    if "fastvideo_kernel" in sys.modules:
        return sys.modules["fastvideo_kernel"]
    old = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_LAZY | os.RTLD_GLOBAL)
    try:
        import fastvideo_kernel
        import fastvideo_kernel.block_sparse_attn  # noqa: F401
    except ImportError as e:
        raise _Skip(f"fastvideo-kernel not importable: {e}")
    finally:
        sys.setdlopenflags(old)
    return fastvideo_kernel


def settle(seconds: float) -> None:
    """Between two entries: wait for the device, return the cached blocks to the driver, sleep
    ``seconds`` (nothing when 0). Without it the entry timed right after FastVideo's ran 3 % slower on
    average in the H100 tables v30-v38 (up to 28 % in one round) while the same entry timed first in a
    round did not (``after_rounds`` records each round's predecessor)."""
    import torch

    if seconds <= 0:
        return
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    time.sleep(seconds)


def round_order(routes: List[str], peers: List[str], rnd: int) -> List[tuple]:
    """The entries of round ``rnd``: routes then peers, rotated by ``rnd`` so that over the rounds
    every entry runs in every position (a fixed order gave the later entries of a round a warmer,
    slower-clocked GPU: identical kernels measured 1-2 % apart in one run, v19)."""
    entries = [("route", r) for r in routes] + [("peer", p) for p in peers]
    if not entries:
        return []
    k = rnd % len(entries)
    return entries[k:] + entries[:k]


def run_benchmark(args) -> dict:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_vsa.py needs a CUDA GPU (use --replot to redraw a chart from JSON on CPU)")
    env = environment()
    name = args.name or default_name(env)
    runner = Runner(args)
    t0 = time.time()
    print(f"bench_vsa: {env.get('gpu')} torch {env.get('torch')} triton {env.get('triton')} "
          f"cutlass-dsl {env.get('nvidia-cutlass-dsl')} flash-attn-4 {env.get('flash-attn-4')}", flush=True)
    shapes = [(None, tile) for tile in args.tile] if args.grid is not None else \
        [(seqlen, None) for seqlen in args.seqlens]
    for seqlen, tile in shapes:
        for block in ([None] if tile is not None else args.block_size):
            for sparsity in args.sparsity:
                case = Case(args, seqlen, block, sparsity, "cuda", tile=tile)
                for mode in args.modes:
                    prev = None  # the entry that ran just before (recorded per round: ``after_rounds``)
                    for rnd in range(max(1, args.rounds)):
                        for kind, entry in round_order(args.routes, args.peers, rnd):
                            settle(args.settle)
                            n0 = len(runner.results)
                            if kind == "peer":
                                runner.run_peer(entry, case, mode)
                            elif entry == "sm120":
                                runner.run_sm120(case, mode)
                            else:
                                runner.run_route(entry, case, mode)
                            for r in runner.results[n0:]:
                                r["after"] = prev
                            prev = entry
                del case
                torch.cuda.empty_cache()
    runner.results = merge_rounds(runner.results)
    add_ratios(runner.results)
    config = {k: v for k, v in vars(args).items() if k not in ("replot",)}
    return {"schema": 1, "name": name, "created": _dt.datetime.now().isoformat(timespec="seconds"),
            "seconds": time.time() - t0, "env": env, "config": config,
            "flops_note": "effective FLOPs = 4*B*H*D*selected_block_pairs*qblock*kvblock (fwd); bwd x2.5",
            "results": runner.results, "summary": summarize(runner.results)}


def main(argv: Optional[Iterable[str]] = None) -> int:
    args = parse_args(list(argv) if argv is not None else None)
    if args.replot:
        return replot(args.replot, args.plot)
    payload = run_benchmark(args)
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"{payload['name']}.json"
    write_json(payload, out)
    print_table(payload["results"])
    print_summary(payload["summary"])
    if args.write_route_table:
        from route_table_writer import write_route_table

        print(f"route table: {write_route_table(payload, out, args.write_route_table)}")
    print(f"results: {out}")
    if args.plot:
        print(f"plot: {plot_results(payload, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
