#!/usr/bin/env python
"""Issue 17, first way in: FA4's own sm_90 backward class run with 64-wide kv tiles, for 64-token
VSA blocks, beside cuDNN BSA's blk64 backward (the fastest 64-token backward the route table has).

FA4 4.0.0b36 fixes its sm_90 backward tile at ``n_block_size=128`` for head_dim 128
(``interface._tile_size_bwd_sm90``), which is why the library's FA4 route does not serve a 64-token
backward on Hopper. FA4's own config search (``flash_attn.cute.sm90_config_search``) lists
feasible 64x64 configs; this script swaps one in for the duration of a run (the function is
replaced in FA4's module, nothing is installed or kept) and builds the kv-owned lists with the
adapter's builder at a 64-token kv tile.

  --compile sm_90   compile only, on a CPU box (fake CUDA tensors, as tests/adapters/test_fa4_compile.py)
  --all-configs     every 64x64 config the search lists (18 for head_dim 128), not just two
  (default)         on the GPU: exactness against the fp32 reference on a small case, then the
                    time of both backwards on S=32768 and the Wan-1.3B grid (metadata prebuilt)

An experiment, not a route: nothing in the library calls it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# 64x64 configs from find_feasible_bwd_configs(128, 128) (tile_m=tile_n=64, two MMA warpgroups)
CONFIGS = {
    "64x64-a": dict(m_block_size=64, n_block_size=64, num_stages_Q=2, num_stages_dO=2, num_stages_PdS=1,
                    SdP_swapAB=False, dKV_swapAB=False, dQ_swapAB=False, AtomLayoutMSdP=1, AtomLayoutNdKV=1,
                    AtomLayoutMdQ=1),
    "64x64-b": dict(m_block_size=64, n_block_size=64, num_stages_Q=2, num_stages_dO=2, num_stages_PdS=1,
                    SdP_swapAB=True, dKV_swapAB=False, dQ_swapAB=False, AtomLayoutMSdP=2, AtomLayoutNdKV=1,
                    AtomLayoutMdQ=1),
}


def searched_configs():
    """Every 64x64 config ``find_feasible_bwd_configs(128, 128)`` lists (FA4's own search), named
    ``s<i>``, as BwdConfig keyword arguments."""
    from flash_attn.cute.sm90_config_search import find_feasible_bwd_configs

    out = {}
    for c in find_feasible_bwd_configs(128, 128):
        if c["tile_m"] != 64 or c["tile_n"] != 64:
            continue
        out[f"s{len(out)}"] = dict(
            m_block_size=64, n_block_size=64, num_stages_Q=c["Q_stage"], num_stages_dO=c["dO_stage"],
            num_stages_PdS=c["PdS_stage"], SdP_swapAB=c["SdP_swapAB"], dKV_swapAB=c["dKV_swapAB"],
            dQ_swapAB=c["dQ_swapAB"], AtomLayoutMSdP=c["AtomLayoutMSdP"], AtomLayoutNdKV=c["AtomLayoutNdKV"],
            AtomLayoutMdQ=c["AtomLayoutMdQ"], num_wg=c["num_wg"])
    return out


def _patch(iface, name):
    cfg = iface.BwdConfig(**CONFIGS[name])
    iface._tile_size_bwd_sm90 = lambda *a, **k: cfg


def _plan():
    from fastvideo_cute.adapters.fa4_plan import FA4Plan

    return FA4Plan(block_size=64, q_sparse=64, kv_tile=64, tile_mn=None, single_q_stage=False)


def _cross_env(out_dir: Path) -> None:
    """The sm_90a cross-compile environment; must be set before anything imports cutlass."""
    os.environ.update(FLASH_ATTENTION_ARCH="sm_90", CUTE_DSL_ARCH="sm_90a", FLASH_ATTENTION_NUM_SMS="132",
                      CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=str(out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)


def compile_only(out_dir: Path) -> dict:
    _cross_env(out_dir)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fastvideo_cute.adapters import fa4 as A

    fa = A.load_fa4()
    B, H, S, D = 1, 2, 1024, 128
    g = torch.Generator().manual_seed(0)
    block_map = torch.rand(B, H, S // 64, S // 64, generator=g) < 0.5
    sizes = torch.full((S // 64,), 64, dtype=torch.int32)
    sizes[-1] = 21
    meta = A.build_bwd_metadata(block_map, sizes, _plan())

    def fake_like(t):
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cuda")

    res = {}
    for name in CONFIGS:
        _patch(fa.interface, name)
        t0, err = time.time(), None
        before = set(fa.bwd.compile_cache.cache)
        try:
            with FakeTensorMode():
                fmeta = A.FA4Metadata(A.FA4SparseIndex(*(fake_like(x) for x in meta.index[:4]), meta.index.block_size),
                                      fake_like(meta.kv_tile_sizes), meta.plan)
                q, k, v, o, do = (torch.empty(B, S, H, D, dtype=torch.bfloat16, device="cuda") for _ in range(5))
                lse = torch.empty(B, H, S, dtype=torch.float32, device="cuda")
                A.fa4_block_sparse_bwd_prebuilt(q, k, v, o, do, lse, fmeta)
        except Exception as e:  # report and go on
            err = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
        new = [key for key in fa.bwd.compile_cache.cache if key not in before]
        res[name] = {"seconds": round(time.time() - t0, 1), "error": err, "new_kernels": len(new),
                     "cubin_bytes": [len(fa.bwd.compile_cache.cache[key].artifacts.CUBIN or b"") for key in new]}
        print(name, res[name], flush=True)
    return res


def on_gpu(args) -> dict:
    import types

    import torch
    from triton.testing import do_bench

    from bench_vsa import Case
    from fastvideo_cute import reference
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.adapters import fa4 as A
    from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
    from fastvideo_cute.metadata import map_to_index

    fa = A.load_fa4()
    fplan = A.fa4_fwd_plan(A.fa4_arch(), 64)
    bplan = _plan()
    out = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("FVC_COMMIT"), "configs": CONFIGS,
           "exactness": {}, "timing": []}

    def fa4_bwd(q, k, v, o, do, lse, block_map, sizes):
        meta = A.build_bwd_metadata(block_map, sizes, bplan)
        return meta, (lambda: A.fa4_block_sparse_bwd_prebuilt(q, k, v, o, do, lse, meta))

    # exactness: small ragged case against the fp32 reference
    g = torch.Generator(device="cuda").manual_seed(1)
    B, H, S, D = 1, 2, 1024, 128
    q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    block_map = torch.rand(B, H, S // 64, S // 64, device="cuda", generator=g) < 0.3
    block_map[..., 0, :] = False
    sizes = torch.full((S // 64,), 64, dtype=torch.int32, device="cuda")
    sizes[3], sizes[-1] = 0, 37
    valid = (torch.arange(64, device="cuda")[None, :] < sizes[:, None]).reshape(1, -1, 1, 1)
    k, v = k * valid, v * valid  # zero padding (what the route's padding copy gives)
    fmeta = A.build_fwd_metadata(block_map, sizes, fplan)
    o, lse = A.fa4_block_sparse_fwd_prebuilt(q, k, v, fmeta)
    ref_in = [t.detach().float().transpose(1, 2).requires_grad_(True) for t in (q, k, v)]
    ref_out = reference.block_sparse_attn_reference(*ref_in, block_map, sizes, 64)
    ref_out = ref_out[0] if isinstance(ref_out, tuple) else ref_out
    ref_g = torch.autograd.grad(ref_out, ref_in, do.float().transpose(1, 2))
    for name in CONFIGS:
        _patch(fa.interface, name)
        try:
            _, run = fa4_bwd(q, k, v, o, do, lse, block_map, sizes)
            got = run()
            errs = {n: float((a.float().transpose(1, 2) - r).abs().max()) for n, a, r in zip(("dq", "dk", "dv"), got, ref_g)}
            scale = {n: float(r.abs().max()) for n, r in zip(("dq", "dk", "dv"), ref_g)}
            out["exactness"][name] = {"max_abs_err": errs, "ref_max_abs": scale}
        except Exception as e:
            out["exactness"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        print(name, out["exactness"][name], flush=True)

    cargs = types.SimpleNamespace(grid=[21, 30, 52], dtype="bf16", batch=1, heads=12, head_dim=128, seed=0, ragged=False)
    for tile in (None, (4, 4, 4)):
        case = Case(cargs, 32768, 64, 0.875, "cuda", tile=tile)
        q, k, v, do = (case.bshd(t) for t in (case.q, case.k, case.v, case.dout))
        flops = case.flops["bwd"]
        idx, num = map_to_index(case.block_map)
        cmeta = build_cudnn_metadata(idx, num, case.sizes, block_size=64, batch=1, heads=12, q_len=case.seqlen,
                                     kv_len=case.seqlen, all_full=case.all_full)
        o, lse = C.cudnn_fwd_prebuilt(q, k, v, cmeta, bshd=True, softmax_scale=None)
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        ref = C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, cmeta, bshd=True, softmax_scale=None)
        ms_c = do_bench(lambda: C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, cmeta, bshd=True, softmax_scale=None,
                                                     dq=dq, dk=dk, dv=dv), warmup=args.warmup, rep=args.rep)
        row = {"seqlen": case.seqlen, "grid": list(case.grid) if case.grid else None, "cudnn_bwd_ms": ms_c,
               "cudnn_tflops": flops / ms_c / 1e9}
        for name in CONFIGS:
            _patch(fa.interface, name)
            try:
                _, run = fa4_bwd(q, k, v, o, do, lse, case.block_map, case.sizes)
                got = run()
                ms = do_bench(run, warmup=args.warmup, rep=args.rep)
                row[name] = {"ms": ms, "tflops": flops / ms / 1e9, "vs_cudnn": ms_c / ms,
                             "max_abs_diff_vs_cudnn": {n: float((a - b).abs().max()) for n, a, b in
                                                       zip(("dq", "dk", "dv"), got, ref)}}
            except Exception as e:
                row[name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        print(json.dumps(row), flush=True)
        out["timing"].append(row)
        del case
        torch.cuda.empty_cache()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile", choices=["sm_90"], default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--all-configs", action="store_true",
                    help="every 64x64 config of FA4's config search instead of the two fixed ones")
    args = ap.parse_args(argv)
    dump = Path(args.out or "/tmp/fa4_bwd64") / "dump"
    if args.compile:
        _cross_env(dump)
    if args.all_configs:
        CONFIGS.clear()
        CONFIGS.update(searched_configs())
    if args.compile:
        res = compile_only(dump)
    else:
        res = on_gpu(args)
    if args.out:
        Path(args.out).with_suffix(".json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
