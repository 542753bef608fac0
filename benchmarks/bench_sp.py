#!/usr/bin/env python
"""Sequence-parallel (Ulysses) VSA scaling: one attention layer of a video DiT at 1..N GPUs.

One "layer" is what a model's attention layer runs per step: the fused all-to-all of q, k, v and
the gate to the head sharding, VSA (``video_sparse_attn``, compression + top-k + sparse branch +
gate) for H/n heads over the whole sequence, and the all-to-all of the output back
(``fastvideo_cute.distributed.ulysses_video_sparse_attn``, BSHD). Default shape: the
``wan2.1-14b-720p`` preset of ``fastvideo_cute/warmup_presets.py`` (H=40, D=128, latent grid
21x45x80, 4x4x4 tiles: 1440 tiles, 92,160 tokens), 87.5 % block sparsity (topk = 180), bf16.

Launch once with all GPUs; every world size n <= N that divides the head count is measured in the
same run, on the sub-group of ranks 0..n-1 (the others wait):

    torchrun --nproc_per_node=8 benchmarks/bench_sp.py --plot benchmarks/results/sp_h200.png
    python benchmarks/bench_sp.py            # world size 1 without torchrun (one GPU)
    python benchmarks/bench_sp.py --smoke    # tiny shapes (also on CPU: gloo + TRITON_INTERPRET=1)

Per n (median of --reps timed runs after --warmup; each run starts behind a barrier; CUDA events;
the reported time is the max over the group's ranks):

- ``layer``: the Ulysses layer, forward (``fwd``, inference: no grad) and forward + backward
  (``fwdbwd``: ``torch.autograd.grad`` of the output with respect to q, k, v, gate);
- ``attn``: the attention alone as each rank runs it (H/n heads, the whole sequence, no comm);
- ``a2a``: the exchanges alone (pack + one all_to_all_single + unpack, as the layer does them):
  ``in`` (q, k, v, gate to heads) + ``out`` (output to sequence) for fwd, plus ``dout`` (to heads)
  + ``grads`` (dq, dk, dv, dgate to sequence) for fwdbwd; ``nccl`` is the bare collective of the
  same bytes; ``exposed`` = layer - attn (the communication the layer does not hide);
- strong scaling (H fixed): efficiency = t(1) / (n * t(n));
- weak scaling (``--weak-heads`` heads per rank, H = that x n, same sequence and sparsity, so
  every rank's attention work is the same at every n): efficiency = t(1) / t(n);
- at n = 1, the overhead of the Ulysses call (a zero-copy pass-through) over calling
  ``video_sparse_attn_bshd`` directly, per mode, timed interleaved (target <= 2 %).

Writes JSON (environment, arguments, rows) to benchmarks/results/<name>.json and, when matplotlib
is installed, the chart beside it (or at --plot; ``--replot JSON --plot PNG`` redraws it anywhere).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MODES = ("fwd", "fwdbwd")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_sp.py", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                                description="Ulysses sequence-parallel VSA: per-layer time and scaling at 1..N GPUs.")
    p.add_argument("--preset", default="wan2.1-14b-720p", help="model preset (fastvideo_cute/warmup_presets.py)")
    p.add_argument("--block", type=int, default=64, choices=[64, 128, 256], help="tile size (tokens)")
    p.add_argument("--sparsity", type=float, default=0.875, help="topk = ceil((1 - sparsity) * tiles)")
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    p.add_argument("--world-sizes", type=int, nargs="*", default=None,
                   help="group sizes to measure (default: every n <= world size dividing the heads)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--head-chunks", type=int, nargs="+", default=[1],
                   help="ulysses head_chunks values to measure (1 = one fused all-to-all each way)")
    p.add_argument("--weak-heads", type=int, default=5, help="heads per rank for weak scaling (0: skip)")
    p.add_argument("--route", default="triton", choices=["triton", "cute"],
                   help="triton: FASTVIDEO_VSA_TRITON=1; cute: FASTVIDEO_VSA_CUTEDSL=1")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--overhead-reps", type=int, default=15, help="interleaved reps of the n=1 overhead check")
    p.add_argument("--smoke", action="store_true", help="tiny shapes (H=4, D=32, grid 4x8x16: 8 tiles of 64), 1 rep")
    p.add_argument("--name", default=None, help="results/<name>.json (default sp_<gpu>)")
    p.add_argument("--out", default=None, help="JSON path (overrides --name)")
    p.add_argument("--plot", default=None, help="PNG path for the chart (default: beside the JSON, if matplotlib)")
    p.add_argument("--no-plot", action="store_true", help="write no chart")
    p.add_argument("--replot", default=None, help="redraw --plot from this JSON and exit (no GPU needed)")
    return p


def world_sizes(requested: Optional[List[int]], world: int, heads: int) -> List[int]:
    if requested:
        bad = [n for n in requested if n < 1 or n > world or heads % n]
        if bad:
            raise SystemExit(f"--world-sizes {bad}: each must be in [1, {world}] and divide {heads} heads")
        return sorted(set(requested))
    return [n for n in range(1, world + 1) if heads % n == 0]


def strong_efficiency(t1: float, tn: float, n: int) -> float:
    return t1 / (n * tn)


def weak_efficiency(t1: float, tn: float) -> float:
    return t1 / tn


def add_efficiencies(rows: List[dict]) -> None:
    """Fill ``efficiency`` of every layer row from the n = 1 row of its series."""
    base = {}
    for r in rows:
        if r["kind"] == "layer" and r["n"] == 1:
            base[(r["scaling"], r["mode"], r["head_chunks"])] = r["ms"]
            base.setdefault((r["scaling"], r["mode"], None), r["ms"])
    for r in rows:
        if r["kind"] != "layer":
            continue
        t1 = base.get((r["scaling"], r["mode"], r["head_chunks"])) or base.get((r["scaling"], r["mode"], None))
        if t1 is None:
            continue
        if r["scaling"] == "strong":
            r["efficiency"] = strong_efficiency(t1, r["ms"], r["n"])
        else:
            r["efficiency"] = weak_efficiency(t1, r["ms"])


# ---------------------------------------------------------------------------------------------
# timing (collective: every rank of the group runs the same number of iterations)
# ---------------------------------------------------------------------------------------------


def _sync_point(dist, group, device):
    import torch

    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(torch.zeros(1, device=device), group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], dist, group, device, warmup: int, reps: int) -> float:
    """Median over ``reps`` of one call, each started behind a barrier; max over the group."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        _sync_point(dist, group, device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    med = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(med, op=dist.ReduceOp.MAX, group=group)
    return float(med.item())


# ---------------------------------------------------------------------------------------------
# the measurements
# ---------------------------------------------------------------------------------------------


class Problem:
    """One shape: grid, tile, heads, head_dim, dtype; global sizes and topk on ``device``."""

    def __init__(self, grid, tile, heads, head_dim, dtype, sparsity, device):
        import torch

        import fastvideo_cute as fvc

        self.grid, self.tile, self.heads, self.head_dim, self.dtype = grid, tile, heads, head_dim, dtype
        self.block = math.prod(tile)
        self.seq = fvc.padded_length(grid, tile)
        self.tiles = self.seq // self.block
        self.topk = max(1, math.ceil((1.0 - sparsity) * self.tiles))
        self.sizes = fvc.variable_block_sizes(grid, tile, device=device)
        self.device = device
        self._torch = torch

    def tensors(self, n: int, heads: int, grad: bool, count: int = 4, seed: int = 0):
        """``count`` BSHD tensors of one rank's slice at group size n ([1, S/n, heads, D])."""
        torch = self._torch
        g = torch.Generator(device=self.device).manual_seed(seed)
        shape = (1, self.seq // n, heads, self.head_dim)
        return [torch.randn(shape, generator=g, device=self.device, dtype=self.dtype).requires_grad_(grad)
                for _ in range(count)]


def _layer_fns(prob: Problem, n: int, heads: int, group, chunks: int):
    import torch

    import fastvideo_cute as fvc
    from fastvideo_cute.distributed import ulysses_video_sparse_attn

    q, k, v, gate = prob.tensors(n, heads, grad=True)
    dout = prob.tensors(n, heads, grad=False, count=1, seed=1)[0]

    def layer(grad: bool):
        with torch.set_grad_enabled(grad):
            out = ulysses_video_sparse_attn(q, k, v, prob.sizes, prob.sizes, prob.topk, prob.tile, gate,
                                            group=group, layout="bshd", head_chunks=chunks)
            if grad:
                torch.autograd.grad(out, (q, k, v, gate), dout)

    fq, fk, fv, fg = prob.tensors(1, heads // n, grad=True, seed=2)  # what one rank attends over
    fdout = prob.tensors(1, heads // n, grad=False, count=1, seed=3)[0]

    def attn(grad: bool):
        with torch.set_grad_enabled(grad):
            out = fvc.video_sparse_attn_bshd(fq, fk, fv, prob.sizes, prob.sizes, prob.topk, prob.tile, fg)
            if grad:
                torch.autograd.grad(out, (fq, fk, fv, fg), fdout)

    return layer, attn, (q, k, v, gate, dout), (fq, fk, fv, fg, fdout)


def _exchange_fns(prob: Problem, n: int, group, local, full):
    """The layer's four exchanges alone, and the bare collective of the forward's bytes."""
    import torch
    import torch.distributed as dist

    from fastvideo_cute.distributed import exchange as ex

    q, k, v, gate, dout = [t.detach() for t in local]
    fq, fk, fv, fg, fdout = [t.detach() for t in full]
    fulls = [torch.empty_like(t) for t in (fq, fk, fv, fg)]
    locs = [torch.empty_like(t) for t in (q, k, v, gate)]

    def to_heads(srcs, dsts):
        ex.finish(ex.start([ex.heads_view(s, n, True) for s in srcs], group), [ex.seq_view(d, n, True) for d in dsts])

    def to_seq(srcs, dsts):
        ex.finish(ex.start([ex.seq_view(s, n, True) for s in srcs], group), [ex.heads_view(d, n, True) for d in dsts])

    fns = {
        "in": lambda: to_heads((q, k, v, gate), fulls),
        "out": lambda: to_seq((fq,), locs[:1]),
        "dout": lambda: to_heads((dout,), fulls[:1]),
        "grads": lambda: to_seq((fq, fk, fv, fg), locs),
    }
    send = torch.empty(4 * q.numel() * q.element_size(), dtype=torch.uint8, device=q.device)
    recv = torch.empty_like(send)
    fns["nccl_in"] = lambda: dist.all_to_all_single(recv, send, group=group)
    return fns


def measure(args, dist, rank: int, world: int, device) -> List[dict]:
    import torch

    from fastvideo_cute.warmup_presets import get_preset, tile_for_block

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if args.smoke:
        grid, heads, head_dim, weak_heads = (4, 8, 16), 4, 32, (1 if args.weak_heads else 0)
    else:
        preset = get_preset(args.preset)
        grid, heads, head_dim, weak_heads = preset.latent_grid, preset.heads, preset.head_dim, args.weak_heads
    tile = tile_for_block(args.block)
    ns = world_sizes(args.world_sizes, world, heads)
    # Every rank creates every sub-group, in the same order (torch.distributed requires it).
    groups = {n: (dist.new_group(list(range(n))) if dist.is_initialized() else None) for n in ns}
    rows: List[dict] = []
    meta = {"grid": list(grid), "tile": list(tile), "head_dim": head_dim, "dtype": args.dtype}

    def series(scaling: str, heads_at: Callable[[int], int]):
        for n in ns:
            h = heads_at(n)
            prob = Problem(grid, tile, h, head_dim, dtype, args.sparsity, device)
            if rank < n:
                group = groups[n]
                for chunks in (args.head_chunks if n > 1 else [1]):
                    if chunks > h // n:
                        continue
                    layer, attn, local, full = _layer_fns(prob, n, h, group, chunks)
                    for mode in args.modes:
                        grad = mode == "fwdbwd"
                        ms = time_ms(lambda: layer(grad), dist, group, device, args.warmup, args.reps)
                        a_ms = time_ms(lambda: attn(grad), dist, group, device, args.warmup, args.reps)
                        row = dict(meta, kind="layer", scaling=scaling, n=n, heads=h, head_chunks=chunks, mode=mode,
                                   seq=prob.seq, tiles=prob.tiles, topk=prob.topk, ms=ms, attn_ms=a_ms,
                                   exposed_ms=ms - a_ms)
                        if n > 1 and chunks == args.head_chunks[0]:
                            ex = _exchange_fns(prob, n, group, local, full)
                            a2a = {k: time_ms(f, dist, group, device, args.warmup, args.reps) for k, f in ex.items()}
                            keys = ("in", "out") if mode == "fwd" else ("in", "out", "dout", "grads")
                            row["a2a_ms"] = {k: a2a[k] for k in keys}
                            row["a2a_total_ms"] = sum(a2a[k] for k in keys)
                            row["nccl_in_ms"] = a2a["nccl_in"]
                        if rank == 0:
                            rows.append(row)
                            print(f"[{scaling} n={n} H={h} chunks={chunks} {mode}] layer {ms:.3f} ms, attention "
                                  f"{a_ms:.3f} ms, a2a {row.get('a2a_total_ms', 0.0):.3f} ms", flush=True)
                    del layer, attn, local, full
            if dist.is_initialized():
                dist.barrier()
            if device.type == "cuda":
                torch.cuda.empty_cache()

    series("strong", lambda n: heads)
    if weak_heads:
        series("weak", lambda n: weak_heads * n)

    if 1 in ns and rank == 0:  # world size 1: the pass-through against the direct call
        rows.extend(overhead_rows(args, prob_at_1=Problem(grid, tile, heads, head_dim, dtype, args.sparsity, device),
                                  group=groups[1], dist=dist, device=device, meta=meta))
    add_efficiencies(rows)
    if dist.is_initialized():
        dist.barrier()
    return rows


def overhead_rows(args, prob_at_1: Problem, group, dist, device, meta: dict) -> List[dict]:
    """``ulysses_video_sparse_attn`` on a group of one vs ``video_sparse_attn_bshd`` on the same
    tensors, timed interleaved (one call each, alternately, ``--overhead-reps`` times; medians)."""
    import torch

    import fastvideo_cute as fvc
    from fastvideo_cute.distributed import ulysses_video_sparse_attn

    prob = prob_at_1
    q, k, v, gate = prob.tensors(1, prob.heads, grad=True)
    dout = prob.tensors(1, prob.heads, grad=False, count=1, seed=1)[0]
    out_rows = []
    for mode in args.modes:
        grad = mode == "fwdbwd"

        def call(fn):
            def run():
                with torch.set_grad_enabled(grad):
                    out = fn()
                    if grad:
                        torch.autograd.grad(out, (q, k, v, gate), dout)
            return run

        direct = call(lambda: fvc.video_sparse_attn_bshd(q, k, v, prob.sizes, prob.sizes, prob.topk, prob.tile, gate))
        ulysses = call(lambda: ulysses_video_sparse_attn(q, k, v, prob.sizes, prob.sizes, prob.topk, prob.tile, gate,
                                                         group=group, layout="bshd"))
        td, tu = [], []
        for i in range(max(1, args.overhead_reps)):
            td.append(time_ms(direct, dist, None, device, 1 if i == 0 else 0, 1))
            tu.append(time_ms(ulysses, dist, None, device, 1 if i == 0 else 0, 1))
        d_ms, u_ms = statistics.median(td), statistics.median(tu)
        pct = 100.0 * (u_ms - d_ms) / d_ms
        out_rows.append(dict(meta, kind="overhead", n=1, heads=prob.heads, mode=mode, seq=prob.seq, direct_ms=d_ms,
                             ulysses_ms=u_ms, overhead_pct=pct, reps=len(td)))
        print(f"[n=1 overhead {mode}] direct {d_ms:.3f} ms, ulysses {u_ms:.3f} ms: {pct:+.2f} %", flush=True)
    return out_rows


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------


def environment(device) -> dict:
    import torch

    env = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "host": platform.node(),
           "python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpus_visible"] = torch.cuda.device_count()
        env["cuda"] = torch.version.cuda
        try:
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:  # noqa: BLE001
            env["nccl"] = None
    try:
        env["git_commit"] = os.environ.get("FVC_COMMIT") or subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        env["git_dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                               capture_output=True, text=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        env["git_commit"] = os.environ.get("FVC_COMMIT")
    return env


def plot(payload: dict, path: str) -> Optional[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[plot] matplotlib is not installed; skipping the chart (redraw later with --replot)")
        return None
    rows = [r for r in payload["results"] if r["kind"] == "layer"]
    if not rows:
        print("[plot] no layer rows")
        return None
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode in MODES:
        sel = sorted((r for r in rows if r["scaling"] == "strong" and r["mode"] == mode and r["head_chunks"] ==
                      min(x["head_chunks"] for x in rows)), key=lambda r: r["n"])
        if sel:
            ns = [r["n"] for r in sel]
            ax_t.plot(ns, [r["ms"] for r in sel], "o-", label=f"layer {mode}")
            ax_t.plot(ns, [r["attn_ms"] for r in sel], "s--", label=f"attention alone {mode}")
            comm = [r for r in sel if "a2a_total_ms" in r]
            if comm:
                ax_t.plot([r["n"] for r in comm], [r["a2a_total_ms"] for r in comm], "^:",
                          label=f"all-to-all alone {mode}")
        for scaling, style in (("strong", "o-"), ("weak", "s--")):
            sel = sorted((r for r in rows if r["scaling"] == scaling and r["mode"] == mode and "efficiency" in r),
                         key=lambda r: (r["head_chunks"], r["n"]))
            for chunks in sorted({r["head_chunks"] for r in sel}):
                part = [r for r in sel if r["head_chunks"] == chunks or r["n"] == 1]
                part = sorted({r["n"]: r for r in part}.values(), key=lambda r: r["n"])
                lab = f"{scaling} {mode}" + (f" chunks={chunks}" if chunks > 1 else "")
                ax_e.plot([r["n"] for r in part], [r["efficiency"] for r in part], style, label=lab)
    ticks = sorted({r["n"] for r in rows})
    ax_t.set_xticks(ticks)
    ax_e.set_xticks(ticks)
    ax_t.set_xlabel("GPUs (n)")
    ax_t.set_ylabel("ms per attention layer (max over ranks)")
    ax_t.set_yscale("log")
    ax_t.legend(fontsize=7)
    ax_t.grid(alpha=0.3)
    ax_e.axhline(0.9, color="0.5", lw=0.8, ls=":")
    ax_e.axhline(0.8, color="0.5", lw=0.8, ls=":")
    ax_e.set_xlabel("GPUs (n)")
    ax_e.set_ylabel("scaling efficiency")
    ax_e.set_ylim(0, 1.1)
    ax_e.legend(fontsize=7)
    ax_e.grid(alpha=0.3)
    a = payload.get("args", {})
    env = payload.get("environment", {})
    shape = "smoke shapes" if a.get("smoke") else a.get("preset")
    fig.suptitle(f"Ulysses VSA, {shape} (block {a.get('block')}, sparsity {a.get('sparsity')}, "
                 f"{a.get('dtype')}, route {a.get('route')}) on {env.get('gpu', '?')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.replot:
        payload = json.loads(Path(args.replot).read_text())
        if not args.plot:
            raise SystemExit("--replot needs --plot PATH")
        print(plot(payload, args.plot))
        return 0
    if args.smoke:
        args.reps, args.warmup, args.overhead_reps = 1, 1, 1
    os.environ.pop("FASTVIDEO_VSA_BACKEND", None)
    os.environ.pop("FASTVIDEO_VSA_TRITON" if args.route == "cute" else "FASTVIDEO_VSA_CUTEDSL", None)
    os.environ["FASTVIDEO_VSA_CUTEDSL" if args.route == "cute" else "FASTVIDEO_VSA_TRITON"] = "1"

    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if not cuda:  # a CPU smoke run: the Triton interpreter, whose bf16 arithmetic is wrong
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.dtype = "fp32" if args.dtype == "bf16" else args.dtype
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group("nccl" if cuda else "gloo")
    else:  # one process: a real group of one
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        rows = measure(args, dist, rank, world, device)
        if rank == 0:
            payload = {"benchmark": "bench_sp", "environment": environment(device), "world": world,
                       "args": vars(args), "results": rows}
            gpu = payload["environment"].get("gpu", "cpu").split()[-1].lower()
            out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"{args.name or 'sp_' + gpu}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(payload, indent=1))
            print(f"wrote {out}")
            if not args.no_plot:
                print(plot(payload, args.plot or str(out.with_suffix(".png"))))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
