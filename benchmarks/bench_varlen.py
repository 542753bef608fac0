#!/usr/bin/env python
"""Varlen benchmark: a batch of video clips of different lengths in ONE packed call vs the
same clips one by one, forward and forward+backward.

Default case: two Wan2.1-1.3B clips (12 heads of 128), latent grids 21x30x52 and 13x30x52,
64-token tiles (4, 4, 4), 87.5 % block sparsity (each clip's topk = ceil(0.125 * its kv
blocks)), bf16.

Entries (each timed packed and one by one, the same inputs):
  bsa     fastvideo_cute.varlen.block_sparse_attn_varlen with a prebuilt block-diagonal map
          vs fastvideo_cute.block_sparse_attn_bshd per clip with its own map
  vsa     fastvideo_cute.varlen.video_sparse_attn_varlen (compression + per-clip top-k)
          vs fastvideo_cute.video_sparse_attn_bshd per clip
  compat  fastvideo_cute.compat.fastvideo_kernel.block_sparse_attn_varlen (FastVideo's signature:
          real tokens, per-clip q2k lists) vs the compat block_sparse_attn_from_indices per clip
          on each clip's padded tensors
  fastvideo  (opt-in peer) the compat varlen above vs FastVideo 0.3.5's own
          fastvideo_kernel.block_sparse_attn_varlen (host packing) on the same inputs; records
          which kernel FastVideo ran (its sm_90 TK extension or its Triton)

Modes: ``fwd`` (no grad) and ``fwdbwd`` (forward + backward of a fixed output gradient). Times:
CUDA events around each repetition after warm-up (kernels compiled, value checks cached),
median and min over ``--iters``; wall clock on a CPU (``--smoke`` only). Each entry also
records whether the packed output equals the one-by-one output bit for bit (it must for
``bsa`` and ``compat`` on the Triton route) and the effective TF/s of the sparse attention
(4 * H * D * selected block pairs * block^2 forward, 2.5x that for the backward).

Examples (GPU box):
  python benchmarks/bench_varlen.py                                  # Wan-1.3B pair, all entries
  python benchmarks/bench_varlen.py --grids 21x30x52 13x30x52 9x30x52 --name wan3
  python benchmarks/bench_varlen.py --smoke                           # tiny shapes, any device
Writes benchmarks/results/varlen_<name>.json (``--out`` overrides).
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
from typing import Callable, Dict, List

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ENTRIES = ("bsa", "vsa", "compat", "fastvideo")
LABELS = {"fastvideo": ("fastvideo_cute", "fastvideo_0.3.5")}  # the other entries: packed vs one by one
MODES = ("fwd", "fwdbwd")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench_varlen.py", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--grids", nargs="+", default=["21x30x52", "13x30x52"], help="latent grids TxHxW, one per clip")
    p.add_argument("--tile", type=int, nargs=3, default=[4, 4, 4])
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--sparsity", type=float, default=0.875, help="fraction of kv blocks each q block skips")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    p.add_argument("--entries", nargs="+", choices=ENTRIES, default=["bsa", "vsa", "compat"],
                   help="fastvideo (a peer, opt-in) needs FastVideo's fastvideo_kernel importable")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="wan13b_h200")
    p.add_argument("--out", default=None, help="JSON path (default benchmarks/results/varlen_<name>.json)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny shapes (grids 4x4x8 and 4x4x4, 1 head of 32, 1 iteration): checks the script runs")
    return p


# ------------------------------------------------------------------ inputs


def _grid(text: str):
    parts = tuple(int(x) for x in text.lower().split("x"))
    if len(parts) != 3 or min(parts) < 1:
        raise SystemExit(f"--grids: expected TxHxW, got {text!r}")
    return parts


def make_inputs(args, device: str):
    import torch

    import fastvideo_cute as fvc

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    g = torch.Generator(device="cpu").manual_seed(args.seed)
    tile, h, d = tuple(args.tile), args.heads, args.head_dim
    block = math.prod(tile)
    clips = []
    for text in args.grids:
        grid = _grid(text)
        n_tok = grid[0] * grid[1] * grid[2]
        sizes = fvc.variable_block_sizes(grid, tile, device=device)
        n = sizes.numel()
        topk = max(1, math.ceil((1.0 - args.sparsity) * n))
        raw = [torch.randn(1, n_tok, h, d, generator=g).to(device, dtype) for _ in range(3)]
        tiled = [fvc.to_tiles(x, grid, tile, dim=1)[0] for x in raw]  # [S_i, H, D], padding zero
        block_map = fvc.topk_block_map(torch.rand(h, n, n, generator=g).to(device), topk)
        clips.append(dict(grid=grid, tokens=n_tok, blocks=n, topk=topk, sizes=sizes, q=tiled[0], k=tiled[1],
                          v=tiled[2], map=block_map))
    return clips, block, dtype


def _cu(lengths, device):
    import torch

    return torch.tensor([0] + list(_accumulate(lengths)), dtype=torch.int32, device=device)


def _accumulate(values):
    total = 0
    for x in values:
        total += x
        yield total


# ------------------------------------------------------------------ entries


def build_entry(name: str, clips, block: int, device: str):
    """Returns ``(packed, one_by_one, packed_leaves, per_clip_leaves, selected_pairs)``: two
    callables that take their leaves and return one output per clip (the packed output split),
    the leaves each takes, and the selected block pairs summed over heads and clips."""
    import torch

    import fastvideo_cute as fvc
    from fastvideo_cute import varlen
    from fastvideo_cute.compat import fastvideo_kernel as fk
    from fastvideo_cute.metadata import map_to_index

    blocks = [c["blocks"] for c in clips]
    total = sum(blocks)
    cu = _cu([b * block for b in blocks], device)
    sizes = torch.cat([c["sizes"] for c in clips])
    leaves = {x: torch.cat([c[x] for c in clips]) for x in "qkv"}
    per_clip = [dict(q=c["q"], k=c["k"], v=c["v"]) for c in clips]

    def split(out, lens):
        return list(torch.split(out, lens))

    if name == "bsa":
        gmap = torch.zeros(clips[0]["map"].shape[0], total, total, dtype=torch.bool, device=device)
        off = 0
        for c in clips:
            gmap[:, off:off + c["blocks"], off:off + c["blocks"]] = c["map"]
            off += c["blocks"]
        pairs = int(gmap.sum())

        def packed(L):
            out, _ = varlen.block_sparse_attn_varlen(L["q"], L["k"], L["v"], cu, cu, gmap, sizes, block_size=block)
            return split(out, [b * block for b in blocks])

        def one_by_one(Ls):
            return [fvc.block_sparse_attn_bshd(L["q"][None], L["k"][None], L["v"][None], c["map"], c["sizes"])[0][0]
                    for L, c in zip(Ls, clips)]

        return packed, one_by_one, leaves, per_clip, pairs

    if name == "vsa":
        topks = [c["topk"] for c in clips]
        pairs = sum(c["map"].shape[0] * min(c["topk"], c["blocks"]) * c["blocks"] for c in clips)

        def packed(L):
            out = varlen.video_sparse_attn_varlen(L["q"], L["k"], L["v"], cu, cu, sizes, sizes, topks, block_size=block)
            return split(out, [b * block for b in blocks])

        def one_by_one(Ls):
            return [fvc.video_sparse_attn_bshd(L["q"][None], L["k"][None], L["v"][None], c["sizes"], c["sizes"],
                                               c["topk"], block_size=block)[0] for L, c in zip(Ls, clips)]

        return packed, one_by_one, leaves, per_clip, pairs

    # compat: FastVideo's signature on real tokens
    lists = [map_to_index(c["map"][None]) for c in clips]
    idx_list = [x[0] for x in lists]
    num_list = [x[1] for x in lists]
    vbs = [c["sizes"] for c in clips]
    tokens = [c["tokens"] for c in clips]
    cu_real = _cu(tokens, device)
    pairs = sum(int(c["map"].sum()) for c in clips)
    nonpad = [fk.get_non_pad_index(c["sizes"], block) for c in clips]
    real_leaves = {x: torch.cat([c[x][npi] for c, npi in zip(clips, nonpad)]) for x in "qkv"}  # tile order, no padding

    def packed(L):
        out = fk.block_sparse_attn_varlen(L["q"], L["k"], L["v"], cu_real, cu_real, idx_list, num_list, vbs, vbs,
                                          block_size=block)
        return split(out, tokens)

    if name == "fastvideo":  # the peer: FastVideo's own varlen (host packing) on the same inputs
        real = _fastvideo_kernel()

        def theirs(L):
            out = real.block_sparse_attn_varlen(L["q"], L["k"], L["v"], cu_real, cu_real, idx_list, num_list, vbs, vbs,
                                                block_size=block)
            return split(out, tokens)

        return packed, theirs, real_leaves, real_leaves, pairs

    def one_by_one(Ls):
        return [fk.block_sparse_attn_from_indices(L["q"][None].transpose(1, 2), L["k"][None].transpose(1, 2),
                                                  L["v"][None].transpose(1, 2), i, n, c["sizes"])[0][0]
                .transpose(0, 1)[npi] for L, c, i, n, npi in zip(Ls, clips, idx_list, num_list, nonpad)]

    return packed, one_by_one, real_leaves, per_clip, pairs


def _fastvideo_kernel():
    """FastVideo's own fastvideo_kernel (not our compat alias), or SystemExit with the reason."""
    import importlib
    import sys as _sys

    present = _sys.modules.get("fastvideo_kernel")
    if present is not None and present.__name__.startswith("fastvideo_cute"):
        raise SystemExit("--entries fastvideo: fastvideo_kernel is aliased to fastvideo_cute's compat module")
    try:
        return importlib.import_module("fastvideo_kernel")
    except ImportError as exc:
        raise SystemExit(f"--entries fastvideo: FastVideo's fastvideo_kernel is not importable ({exc})") from None


def _fastvideo_path() -> str:
    """Which kernel FastVideo's 64-token path takes here (its TK extension or its Triton)."""
    import sys as _sys

    mod = _sys.modules.get("fastvideo_kernel.block_sparse_attn")
    if mod is None:
        return "unknown"
    if mod._force_triton():
        return "triton (forced)"
    fwd, bwd = mod._get_sm90_ops()
    return "tk_sm90" if mod._is_sm90() and fwd is not None and bwd is not None else "triton"


# ------------------------------------------------------------------ timing


def _timer(device: str):
    import torch

    if device == "cuda":
        def run(fn: Callable[[], None]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
    else:
        def run(fn: Callable[[], None]) -> float:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
    return run


def time_mode(fn_outputs: Callable, leaves_of: Callable, mode: str, warmup: int, iters: int, timer) -> Dict:
    """``fn_outputs(leaves)`` -> list of outputs; ``leaves_of()`` -> fresh leaf structure."""
    import torch

    if mode == "fwd":
        leaves = leaves_of(False)

        def step():
            with torch.no_grad():
                fn_outputs(leaves)
    else:
        leaves = leaves_of(True)
        flat = _flat(leaves)
        grads = None

        def step():
            nonlocal grads
            outs = fn_outputs(leaves)
            if grads is None:
                gen = torch.Generator(device="cpu").manual_seed(1)
                grads = [torch.randn(o.shape, generator=gen).to(o.device, o.dtype) for o in outs]
            torch.autograd.grad(outs, flat, grads)
    for _ in range(warmup):
        step()
    times = [timer(step) for _ in range(iters)]
    return {"median_ms": statistics.median(times), "min_ms": min(times), "iters": iters}


def _flat(leaves) -> List:
    if isinstance(leaves, dict):
        return list(leaves.values())
    return [t for L in leaves for t in L.values()]


def _leaves(struct, grad: bool):
    if isinstance(struct, dict):
        return {k: v.detach().clone().requires_grad_(grad) for k, v in struct.items()}
    return [{k: v.detach().clone().requires_grad_(grad) for k, v in L.items()} for L in struct]


def _git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=REPO, text=True).strip()
    except Exception:  # noqa: BLE001 - not a git checkout
        return "unknown"


def main(argv=None) -> Dict:
    args = build_parser().parse_args(argv)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.smoke:
        args.grids, args.heads, args.head_dim, args.iters, args.warmup = ["4x4x8", "4x4x4"], 1, 32, 1, 0
        if device == "cpu":
            os.environ.setdefault("TRITON_INTERPRET", "1")
            args.dtype = "fp32"
    clips, block, dtype = make_inputs(args, device)
    timer = _timer(device)
    result = {
        "benchmark": "varlen",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": _git_commit(),
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "env": {k: v for k, v in os.environ.items() if k.startswith("FASTVIDEO_")},
        "config": {"grids": args.grids, "tile": args.tile, "heads": args.heads, "head_dim": args.head_dim,
                   "dtype": args.dtype, "sparsity": args.sparsity, "block": block, "warmup": args.warmup,
                   "iters": args.iters},
        "clips": [{"grid": c["grid"], "tokens": c["tokens"], "blocks": c["blocks"], "topk": c["topk"]} for c in clips],
        "entries": [],
    }
    for name in args.entries:
        try:
            packed, one_by_one, packed_leaves, per_clip, pairs = build_entry(name, clips, block, device)
        except SystemExit as exc:  # a peer that cannot run here is recorded, not fatal
            print(f"{name}: skipped: {exc}", flush=True)
            result["entries"].append({"entry": name, "skipped": str(exc)})
            continue
        with torch.no_grad():
            a = packed(packed_leaves)
            b = one_by_one(per_clip)
        bitwise = all(torch.equal(x, y) for x, y in zip(a, b))
        max_abs = max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))
        la, lb = LABELS.get(name, ("packed", "one_by_one"))
        entry = {"entry": name, "compares": [la, lb], "selected_pairs_all_heads": pairs, "bitwise_equal": bitwise,
                 "max_abs_diff": max_abs}
        if name == "fastvideo":
            entry["fastvideo_path"] = _fastvideo_path()
        flops_fwd = 4 * args.head_dim * pairs * block * block
        for mode in args.modes:
            row = {}
            for label, fn, struct in ((la, packed, packed_leaves), (lb, one_by_one, per_clip)):
                t = time_mode(fn, lambda grad, s=struct: _leaves(s, grad), mode, args.warmup, args.iters, timer)
                flops = flops_fwd * (1 + 2.5 if mode == "fwdbwd" else 1)
                t["effective_tflops"] = flops / (t["median_ms"] * 1e-3) / 1e12
                row[label] = t
            row[f"speedup_{la}_vs_{lb}"] = row[lb]["median_ms"] / row[la]["median_ms"]
            entry[mode] = row
            print(f"{name:9s} {mode:7s} {la} {row[la]['median_ms']:9.3f} ms   {lb} {row[lb]['median_ms']:9.3f} ms   "
                  f"speedup {row[lb]['median_ms'] / row[la]['median_ms']:.3f}x   bitwise={bitwise}", flush=True)
        result["entries"].append(entry)
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / f"varlen_{args.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
