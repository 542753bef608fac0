#!/usr/bin/env python
"""Issue 17: what pairing two selected 64-token blocks into one 128-wide MMA tile could gain,
measured before writing the kernel that does it.

The idea (docs/hopper-64-token.md): a kv-owned backward that takes two selected 64-token q blocks
per step (M = 128, FA4's 128x64 configs), and a q-owned forward that takes two selected 64-token
kv blocks per step (N = 128). The upper bound of either is the same kernel on a map where the two
blocks of every pair are *adjacent*: then FA4's own block sparsity can already run it, with a
128-token sparse block on the paired side. This script builds such maps (every q-block pair
``(2i, 2i+1)`` selects the same kv blocks for the backward; every kv-block pair is selected
together for the forward, top-k per row unchanged) and times, on the same inputs and the same
work:

- cuDNN BSA blk64 (the route table's 64-token kernel), forward and backward;
- FA4 sm_90 backward with every 128x64 config of FA4's config search (q sparse 128, kv tile 64);
- FA4 sm_90 forward with a 64x128 tile (q sparse 64, kv sparse 128).

If even the adjacent-pair bound is not >= 1.1x cuDNN, the pairing kernel cannot reach issue 17's
target (its two TMA loads per tile only add to the bound's cost). An experiment, not a route.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))


def bwd_configs(limit: int):
    """128x64 configs of ``find_feasible_bwd_configs(128, 128)``, least shared-memory traffic
    first (the search's own order), as BwdConfig keyword arguments."""
    from flash_attn.cute.sm90_config_search import find_feasible_bwd_configs

    out = {}
    for c in find_feasible_bwd_configs(128, 128):
        if (c["tile_m"], c["tile_n"]) != (128, 64) or len(out) >= limit:
            continue
        out[f"m128n64-{len(out)}"] = dict(
            m_block_size=128, n_block_size=64, num_stages_Q=c["Q_stage"], num_stages_dO=c["dO_stage"],
            num_stages_PdS=c["PdS_stage"], SdP_swapAB=c["SdP_swapAB"], dKV_swapAB=c["dKV_swapAB"],
            dQ_swapAB=c["dQ_swapAB"], AtomLayoutMSdP=c["AtomLayoutMSdP"], AtomLayoutNdKV=c["AtomLayoutNdKV"],
            AtomLayoutMdQ=c["AtomLayoutMdQ"], num_wg=c["num_wg"])
    return out


def paired_maps(case, torch):
    """(row-paired map for the backward, column-paired map for the forward), both 64-granular
    with ``case.topk`` blocks per row (top-k even)."""
    m = case.block_map
    rows = m.clone()
    rows[..., 1::2, :] = rows[..., 0::2, :]
    b, h, qb, kvb = m.shape
    g = torch.Generator(device=m.device).manual_seed(7)
    scores = torch.rand(b, h, qb, kvb // 2, device=m.device, generator=g)
    half = torch.zeros(b, h, qb, kvb // 2, dtype=torch.bool, device=m.device)
    half.scatter_(-1, scores.topk(case.topk // 2, dim=-1).indices, True)
    cols = half.repeat_interleave(2, dim=-1)
    return rows, cols


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536])
    ap.add_argument("--configs", type=int, default=6, help="how many 128x64 backward configs to time")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rep", type=int, default=50)
    args = ap.parse_args(argv)

    import torch
    from triton.testing import do_bench

    from bench_vsa import Case
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.adapters import fa4 as A
    from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
    from fastvideo_cute.adapters.fa4_metadata import FA4Metadata, _index
    from fastvideo_cute.adapters.fa4_plan import FA4Plan
    from fastvideo_cute.metadata import map_to_index

    fa = A.load_fa4()
    configs = bwd_configs(args.configs)
    res = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("FVC_COMMIT"), "bwd_configs": configs,
           "rows": []}
    cargs = types.SimpleNamespace(grid=None, dtype="bf16", batch=1, heads=12, head_dim=128, seed=0, ragged=False)

    def bench(fn):
        return do_bench(fn, warmup=args.warmup, rep=args.rep)

    for S in args.seqlens:
        case = Case(cargs, S, 64, 0.875, "cuda")
        q, k, v, do = (case.bshd(t) for t in (case.q, case.k, case.v, case.dout))
        rows, cols = paired_maps(case, torch)
        kvb = case.nblocks
        row = {"seqlen": S, "topk": case.topk}

        def cudnn_meta(m):
            idx, num = map_to_index(m)
            return build_cudnn_metadata(idx, num, case.sizes, block_size=64, batch=1, heads=12, q_len=S,
                                        kv_len=S, all_full=True)

        # forward on the column-paired map
        cm = cudnn_meta(cols)
        o_ref, lse_ref = C.cudnn_fwd_prebuilt(q, k, v, cm, bshd=True, softmax_scale=None)
        ms_c = bench(lambda: C.cudnn_fwd_prebuilt(q, k, v, cm, bshd=True, softmax_scale=None))
        fplan = FA4Plan(128, 64, 128, (64, 128), False)
        fidx = _index(cols[..., 0::2], None, (64, 128))
        fmeta = FA4Metadata(fidx, torch.full((kvb // 2,), 128, dtype=torch.int32, device="cuda"), fplan)
        fwd = {"cudnn_ms": ms_c, "cudnn_tflops": case.flops["fwd"] / ms_c / 1e9}
        try:
            o, lse = A.fa4_block_sparse_fwd_prebuilt(q, k, v, fmeta)
            ms = bench(lambda: A.fa4_block_sparse_fwd_prebuilt(q, k, v, fmeta))
            fwd["fa4_64x128"] = {"ms": ms, "tflops": case.flops["fwd"] / ms / 1e9, "vs_cudnn": ms_c / ms,
                                 "max_abs_diff_out": float((o - o_ref).abs().max()),
                                 "max_abs_diff_lse": float((lse - lse_ref).abs().max())}
        except Exception as e:
            fwd["fa4_64x128"] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        row["fwd_cols_paired"] = fwd
        print(S, "fwd", json.dumps(fwd), flush=True)

        # backward on the row-paired map
        cm = cudnn_meta(rows)
        o, lse = C.cudnn_fwd_prebuilt(q, k, v, cm, bshd=True, softmax_scale=None)
        ref = C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, cm, bshd=True, softmax_scale=None)
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        ms_c = bench(lambda: C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, cm, bshd=True, softmax_scale=None,
                                                  dq=dq, dk=dk, dv=dv))
        bwd = {"cudnn_ms": ms_c, "cudnn_tflops": case.flops["bwd"] / ms_c / 1e9}
        bplan = FA4Plan(64, 128, 64, None, False)
        bidx = _index(rows[..., 0::2, :].transpose(-2, -1), None, (128, 64))
        bmeta = FA4Metadata(bidx, torch.full((kvb,), 64, dtype=torch.int32, device="cuda"), bplan)
        for name, cfg in configs.items():
            bc = fa.interface.BwdConfig(**cfg)
            fa.interface._tile_size_bwd_sm90 = lambda *a, _c=bc, **kw: _c
            try:
                got = A.fa4_block_sparse_bwd_prebuilt(q, k, v, o, do, lse, bmeta)
                ms = bench(lambda: A.fa4_block_sparse_bwd_prebuilt(q, k, v, o, do, lse, bmeta))
                bwd[name] = {"ms": ms, "tflops": case.flops["bwd"] / ms / 1e9, "vs_cudnn": ms_c / ms,
                             "max_abs_diff_vs_cudnn": {n: float((a - b).abs().max()) for n, a, b in
                                                       zip(("dq", "dk", "dv"), got, ref)}}
            except Exception as e:
                bwd[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            print(S, name, json.dumps(bwd[name]), flush=True)
        row["bwd_rows_paired"] = bwd
        print(S, "bwd cudnn", ms_c, flush=True)
        res["rows"].append(row)
        del case
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
