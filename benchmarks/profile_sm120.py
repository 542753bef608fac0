#!/usr/bin/env python
"""One launch per mma.sync + TMA forward mode (``w4r3``, ``simple_split``), for Nsight Compute (``ncu``).

Each variant is compiled and run twice (JIT, warm caches), then launched once more between
``cudaProfilerStart``/``cudaProfilerStop``, so ``ncu --profile-from-start off`` records exactly one
launch per variant, in the order printed. The lists are prebuilt (``map_to_index``) outside the
profiled region. Shapes default to the issue's benchmark: B=1, H=12, S=32768, D=128, bf16,
87.5 % of kv blocks skipped. The name ``sdpa-flash`` profiles the peer instead: one dense torch SDPA
forward on its flash backend (FlashAttention-2) with the same q, k, v, so both kernels can be read
under the same metrics.

  ncu --profile-from-start off --csv --page raw \
      --metrics sm__warps_active.avg.pct_of_peak_sustained_active,lts__t_sector_op_read_hit_rate.pct,... \
      python benchmarks/profile_sm120.py --variants w4r3 simple_split sdpa-flash > profile.csv
  python benchmarks/profile_sm120.py --to-json profile.csv --variants ... --out results.json   # CPU is fine
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def run(args) -> None:
    import torch

    from fastvideo_cute.adapters import cute_sm120
    from fastvideo_cute.metadata import map_to_index

    g = torch.Generator(device="cuda").manual_seed(args.seed)
    b, h, s, d = 1, args.heads, args.seqlen, 128
    blocks = s // 128
    topk = max(1, round((1 - args.sparsity) * blocks))
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    scores = torch.rand(b, h, blocks, blocks, device="cuda", generator=g)
    block_map = torch.zeros(b, h, blocks, blocks, dtype=torch.bool, device="cuda")
    block_map.scatter_(-1, scores.topk(topk, dim=-1).indices, True)
    idx, num = map_to_index(block_map)
    vbs = torch.full((blocks,), 128, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)

    def sdpa_flash():
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(q, k, v)

    for variant in args.variants:
        if variant == "sdpa-flash":
            call = sdpa_flash
        else:
            call = lambda variant=variant: cute_sm120.sm120_block_sparse_fwd(q, k, v, idx, num, vbs, out=out,
                                                                              variant=variant)
        for _ in range(2):
            call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
        print(f"# profiled variant {variant}: B={b} H={h} S={s} topk={topk}/{blocks}", file=sys.stderr, flush=True)


def to_json(args) -> None:
    """ncu's ``--csv --page raw`` output (one row per profiled launch) -> results JSON."""
    text = Path(args.to_json).read_text()
    start = text.index('"ID"')  # skip the program's own output and ncu's banner lines
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    rows = [r for r in rows if r.get("ID", "").strip().isdigit()]  # drop the units row
    if len(rows) != len(args.variants):
        raise SystemExit(f"{len(rows)} profiled launches, {len(args.variants)} variants named")
    # The raw page also lists every device attribute; keep the kernel's name, launch shape and the
    # measured metrics.
    keep = ("Kernel Name", "Grid Size", "Block Size")
    prefixes = ("gpu__", "sm__", "smsp__", "lts__", "dram__", "l1tex__", "launch__")
    launches = []
    for variant, row in zip(args.variants, rows):
        launches.append({"variant": variant, **{k: v for k, v in row.items() if k in keep or k.startswith(prefixes)}})
    meta = {"seqlen": args.seqlen, "heads": args.heads, "sparsity": args.sparsity, "source": Path(args.to_json).name}
    Path(args.out).write_text(json.dumps({"meta": meta, "launches": launches}, indent=1))
    print(f"wrote {args.out}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=["w4r3", "simple_split"],
                   help="kernel modes (fastvideo_cute.adapters.cute_sm120.VARIANTS) or sdpa-flash")
    p.add_argument("--seqlen", type=int, default=32768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--sparsity", type=float, default=0.875)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--to-json", metavar="CSV", help="convert an ncu CSV (no GPU needed)")
    p.add_argument("--out", default="benchmarks/results/sm120_ncu_h200.json")
    args = p.parse_args(argv)
    if args.seqlen % 128:
        p.error("--seqlen must be a multiple of 128")
    to_json(args) if args.to_json else run(args)


if __name__ == "__main__":
    main()
