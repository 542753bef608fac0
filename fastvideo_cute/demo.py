"""Demo: ``video_sparse_attn`` forward + backward on a synthetic video latent, checked against
the fp32 reference.

    python -m fastvideo_cute.demo [--grid T H W] [--tile 4 4 4] [--heads 2] [--head-dim 64]
                                  [--topk K] [--dtype float16] [--seed 0]

Dataflow: parse and check the arguments (a bad one is a one-line error, exit 2) -> print the
configuration (device, the route that will serve the call and why, shapes, dtype, sparsity,
the tolerance) -> build q, k, v, gate and the upstream gradient from ``--seed`` (a CPU
generator, so a seed gives the same numbers on every run) -> the library's forward + backward
-> the fp32 reference (``fastvideo_cute.reference``) -> per tensor, the error relative to the
reference's largest magnitude -> ``PASS`` (exit 0) or ``FAIL`` (exit 1).

Runs on CUDA if present, else on CPU tensors through the Triton interpreter
(``TRITON_INTERPRET=1``, set here before any kernel is imported; its bf16 math is wrong, so the
CPU default is float16 and bfloat16 is refused there). The wall time is printed on its own line
starting with ``time:``; every other line is identical between two runs with the same arguments.
Limits: the reference is dense (``[B, H, S, S]`` fp32 logits), so large grids need a large GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

# Error metric: max|x - ref| / max|ref| per tensor (out, dq, dk, dv, dgate), i.e. relative to the
# tensor's scale. Each bound is the worst value measured over seeds 0-9 on the shapes below
# (default topk: an eighth of the kv blocks), times 3 for headroom, rounded up:
#   CPU interpreter (fp16, fp32): grids 4x10x10 / 4x8x8 (1 head of 32) / 3x9x7 (tiles 4x4x8);
#   H200 (torch 2.11, triton 3.6; bf16, fp16, fp32): grids 8x30x52 and 4x10x10, tiles 4x4x4,
#   4x4x8 and 2x8x8, head_dim 32/64/128.
#   float32  worst 1.4e-6 on CPU, 4.0e-6 on the H200 (dk)               -> 1.5e-5
#   float16  worst 1.1e-3 on CPU and on the H200 (dv; unit roundoff 4.9e-4) -> 3.5e-3
#   bfloat16 worst 1.1e-2 on the H200 (dv; unit roundoff 3.9e-3, 8x fp16's)  -> 3.5e-2
TOLERANCE = {
    "float32": (1.5e-5, "measured worst 4.0e-6 over seeds 0-9 on CPU and H200, x3 headroom"),
    "float16": (3.5e-3, "measured worst 1.1e-3 over seeds 0-9 on CPU and H200, x3 headroom"),
    "bfloat16": (3.5e-2, "measured worst 1.1e-2 over seeds 0-9 on the H200, x3 headroom"),
}
TILE_ELEMENTS = (64, 128, 256)
CPU_GRID, GPU_GRID = (4, 10, 10), (8, 30, 52)


class _Parser(argparse.ArgumentParser):
    """argparse, with errors on one line: ``prog: error: message (see --help)``, exit 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m fastvideo_cute.demo", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--grid", type=int, nargs=3, metavar=("T", "H", "W"), default=None,
                   help=f"latent grid (default: {CPU_GRID} on CPU, {GPU_GRID} on CUDA)")
    p.add_argument("--tile", type=int, nargs=3, metavar=("TT", "TH", "TW"), default=[4, 4, 4],
                   help="VSA tile; its product is the block length and must be 64, 128 or 256")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64, help="32, 64 or 128 (the Triton route's)")
    p.add_argument("--topk", type=int, default=None,
                   help="kv blocks per q block (default: an eighth of the kv blocks, at least 1)")
    p.add_argument("--dtype", choices=sorted(TOLERANCE), default=None,
                   help="default: bfloat16 on CUDA, float16 on CPU")
    p.add_argument("--seed", type=int, default=0, help="inputs and upstream gradient (a CPU generator)")
    return p


def parse_args(argv=None, cuda: bool = False) -> argparse.Namespace:
    p = _parser()
    a = p.parse_args(argv)
    if a.grid is not None and min(a.grid) < 1:
        p.error(f"--grid needs 3 positive ints, got {a.grid}")
    if min(a.tile) < 1 or math.prod(a.tile) not in TILE_ELEMENTS:
        p.error(f"--tile needs 3 positive ints whose product is 64, 128 or 256, got {a.tile} "
                f"(product {math.prod(a.tile)})")
    if a.heads < 1:
        p.error(f"--heads must be >= 1, got {a.heads}")
    if a.head_dim not in (32, 64, 128):
        p.error(f"--head-dim must be 32, 64 or 128, got {a.head_dim}")
    if a.topk is not None and a.topk < 1:
        p.error(f"--topk must be >= 1, got {a.topk}")
    if a.seed < 0:
        p.error(f"--seed must be >= 0, got {a.seed}")
    if a.dtype == "bfloat16" and not cuda:
        p.error("--dtype bfloat16 needs CUDA: the Triton interpreter's bf16 math is wrong (use float16 or float32)")
    a.grid = tuple(a.grid) if a.grid is not None else (GPU_GRID if cuda else CPU_GRID)
    a.tile = tuple(a.tile)
    a.dtype = a.dtype or ("bfloat16" if cuda else "float16")
    return a


def _why(route, info) -> str:
    """Why ``route`` serves ``info``: which variable decided, the route table, or the default."""
    from .env import BACKEND_VAR, CUTE_FLAG, TRITON_FLAG, env_flag, env_str

    if env_str(BACKEND_VAR):
        return f"forced by {BACKEND_VAR}={env_str(BACKEND_VAR)}"
    if env_flag(TRITON_FLAG):
        return f"forced by {TRITON_FLAG}=1"
    if route.name != "triton":
        return f"the {route.name} backend serves this call (measured route table or {CUTE_FLAG}=1)"
    if not env_flag(CUTE_FLAG):
        return f"the default route for this call; the CuTe route is opt-in with {CUTE_FLAG}=1"
    return f"{CUTE_FLAG}=1, but no CuTe backend serves this call, so Triton: " + _cute_refusals(info)


def _cute_refusals(info) -> str:
    """Each other backend's answer for ``info``, from its own support predicate."""
    from .backends import BACKENDS

    reasons = []
    for name, backend in sorted(BACKENDS.items()):
        if name == "triton":
            continue
        ok, reason = backend.support(info)
        reasons.append(f"{name}: {'only when named (FASTVIDEO_VSA_BACKEND=' + name + ')' if ok else reason}")
    return "; ".join(reasons)


def _say(text: str) -> None:
    print(text, flush=True)


def main(argv=None) -> int:
    import torch

    cuda = torch.cuda.is_available()
    args = parse_args(argv, cuda)
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")

    import fastvideo_cute as fvc
    from fastvideo_cute.reference import video_sparse_attn_reference
    from fastvideo_cute.routes import RouteError, call_info, select_route
    from fastvideo_cute.validation import check_block_sizes

    device = "cuda" if cuda else "cpu"
    dtype = getattr(torch, args.dtype)
    grid, tile, heads, dim = args.grid, args.tile, args.heads, args.head_dim
    be = math.prod(tile)
    tokens = math.prod(grid)
    sizes = fvc.variable_block_sizes(grid, tile, device=device)
    kvb = sizes.numel()
    topk = args.topk if args.topk is not None else max(1, math.ceil(kvb / 8))
    selected = min(topk, kvb)
    s = kvb * be
    bound, origin = TOLERANCE[args.dtype]

    gen = torch.Generator().manual_seed(args.seed)
    raster = [torch.randn(1, tokens, heads, dim, generator=gen) for _ in range(4)]
    q, k, v, gate = (fvc.to_tiles(t.to(device, dtype), grid, tile, dim=1).transpose(1, 2).contiguous()
                     for t in raster)
    dout = torch.randn(q.shape, generator=gen).to(device, dtype)
    for t in (q, k, v, gate):
        t.requires_grad_(True)
    # What video_sparse_attn asks the selector: its sparse branch (no LSE), with grad, after the
    # sizes' range check (which records whether every block is full).
    check_block_sizes(sizes, kvb, be, q.device)
    info = call_info(q, k, be, True, False, need_lse=False, kv_block_sizes=sizes)

    _say("fastvideo_cute demo: video_sparse_attn forward + backward vs the fp32 reference")
    _say(f"  device    {device}" + ("" if cuda else " (no CUDA GPU: Triton interpreter, TRITON_INTERPRET=1)"))
    try:
        route = select_route(info)
    except RouteError as e:
        _say(f"  route     none: {e}")
        _say("FAIL: no route serves this configuration")
        return 1
    _say(f"  route     {route.name} ({_why(route, info)})")
    partial = sum(int(x) < be for x in sizes.tolist())
    _say(f"  latent    grid T,H,W = {grid}, tile {tile} = {be}-token blocks: {tokens} tokens, padded to {s} "
         f"({kvb} blocks, {partial} partial)")
    _say(f"  tensors   q, k, v, gate [B, H, S, D] = {list(q.shape)} {args.dtype}")
    _say(f"  sparsity  topk {topk}: {selected} of {kvb} kv blocks per q block ({100 * (1 - selected / kvb):.1f} % skipped)")
    _say(f"  seed      {args.seed}")
    _say(f"  tolerance max|x - ref| / max|ref| <= {bound:.1e} per tensor ({args.dtype}: {origin})")

    _say(f"[1/3] forward + backward on the {route.name} route ...")
    t0 = time.perf_counter()
    out = fvc.video_sparse_attn(q, k, v, sizes, sizes, topk, block_size=tile, compress_attn_weight=gate)
    grads = torch.autograd.grad(out, (q, k, v, gate), dout)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0

    _say("[2/3] fp32 reference (dense, masked) ...")
    ref = video_sparse_attn_reference(q, k, v, sizes, sizes, topk, block_size=tile, compress_attn_weight=gate)
    ref_grads = torch.autograd.grad(ref, (q, k, v, gate), dout.float())

    _say("[3/3] errors against the reference")
    worst = 0.0
    for name, a, b in zip(("out", "dq", "dk", "dv", "dgate"), (out, *grads), (ref, *ref_grads)):
        scale = b.abs().max().item()
        err = (a.float() - b).abs().max().item() / max(scale, 1e-30)
        worst = max(worst, err) if err == err else math.inf  # NaN fails
        _say(f"  {name:6s} max|x - ref| / max|ref| = {err:.3e}  (max|ref| {scale:.3e})")
    _say(f"time: forward + backward {elapsed * 1e3:.1f} ms (first call: includes JIT compilation or interpretation)")
    verdict = "PASS" if worst <= bound else "FAIL"
    _say(f"{verdict}: worst {worst:.3e} {'<=' if verdict == 'PASS' else '>'} tolerance {bound:.1e}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
