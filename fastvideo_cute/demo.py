"""Demo: ``video_sparse_attn`` forward + backward on a small synthetic video latent.

Runs on the best available route: CUDA if present, else the Triton interpreter on the CPU
(set before any kernel is imported). Prints the route, the error against the fp32
reference, and the time.

    python -m fastvideo_cute.demo [--grid 4 12 12] [--tile 4 4 4] [--heads 2] [--head-dim 64] [--topk 3]
"""

from __future__ import annotations

import argparse
import os
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", type=int, nargs=3, default=None, help="latent grid T H W")
    p.add_argument("--tile", type=int, nargs=3, default=(4, 4, 4), help="VSA tile (product 64, 128 or 256)")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--topk", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import torch

    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    grid = tuple(args.grid) if args.grid else ((16, 30, 52) if cuda else (4, 10, 10))

    import fastvideo_cute as fvc
    from fastvideo_cute.reference import video_sparse_attn_reference
    from fastvideo_cute.routes import call_info, select_route

    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float16  # the interpreter's bf16 math is wrong
    tile = tuple(args.tile)
    g = torch.Generator().manual_seed(args.seed)
    tokens = grid[0] * grid[1] * grid[2]
    # A synthetic latent in raster order, tiled for VSA (padding slots come out zero).
    x = [torch.randn(1, tokens, args.heads, args.head_dim, generator=g).to(device, dtype) for _ in range(4)]
    q, k, v, gate = (fvc.to_tiles(t, grid, tile, dim=1).transpose(1, 2).contiguous() for t in x)
    sizes = fvc.variable_block_sizes(grid, tile, device=device)
    for t in (q, k, v, gate):
        t.requires_grad_(True)
    be = tile[0] * tile[1] * tile[2]
    route = select_route(call_info(q, k, be, True, False)).name

    t0 = time.perf_counter()
    out = fvc.video_sparse_attn(q, k, v, sizes, sizes, args.topk, block_size=tile, compress_attn_weight=gate)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v, gate), dout)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0

    ref = video_sparse_attn_reference(q, k, v, sizes, sizes, args.topk, block_size=tile, compress_attn_weight=gate)
    ref_grads = torch.autograd.grad(ref, (q, k, v, gate), dout.float())
    print(f"fastvideo_cute demo: grid={grid} tile={tile} tokens={tokens} (padded {q.shape[2]}), heads={args.heads}, "
          f"head_dim={args.head_dim}, topk={args.topk}/{sizes.numel()} blocks, {dtype}, device={device}")
    print(f"route: {route}" + (" (Triton interpreter on CPU)" if not cuda else ""))
    print(f"forward max|out - ref| = {(out.float() - ref).abs().max().item():.3e}")
    for name, a, b in zip(("dq", "dk", "dv", "dgate"), grads, ref_grads):
        print(f"backward max|{name} - ref| = {(a.float() - b).abs().max().item():.3e}")
    print(f"forward + backward time: {elapsed * 1e3:.1f} ms (first call, includes JIT/interpretation)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
