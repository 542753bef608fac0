#!/usr/bin/env python
"""Issue 17: our own sm_90a 64-token forward (``kernels/cute/block_sparse_fwd64/block_sparse_fwd64_sm90``)
beside cuDNN BSA's blk64 forward, through the same host path (the permuted views and metadata of
``adapters/cudnn_bsa_direct``), on the H200.

1. exactness against the fp32 reference: ragged sizes, an empty kv block, a query tile with no
   entry, NaN/Inf in padded K/V rows, q_len != kv_len, B = 2, BHSD and BSHD;
2. time of both kernels (metadata prebuilt) at S=32768, 65536 and the Wan-1.3B grid (partial
   tiles): ours reads the raw K/V (it masks V's padding itself), cuDNN the zero-padded copies
   (without them it returns NaN when the padding holds NaN);
3. (unless ``--no-gate``) VSA's gate composition in an inference call: cuDNN + V's copy + the
   gate pass against our ``fuse_gate`` epilogue, and their largest difference.

  python benchmarks/explore_fwd64_sm90.py --out /tmp/fwd64.json
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

def ours(q, k, v, idx, num, sizes, *, bshd: bool, gate=None, out_c=None, variant=None, kv_splits: int = 1):
    """(out, lse) of our kernel, in the call layout (``adapters/cute_sm90_fwd64``)."""
    from fastvideo_cute.adapters.cute_sm90_fwd64 import sm90_fwd64

    return sm90_fwd64(q, k, v, idx, num, sizes, bshd=bshd, gate=gate, out_c=out_c, variant=variant,
                      kv_splits=kv_splits)


_VARIANT_KEYS = {"k": "k_stages", "v": "v_stages", "c": "ctas_per_sm"}
_VARIANT_FLAGS = {"l": ("lazy_rescale", True), "e": ("lazy_rescale", False), "u": ("lazy_vote", True),
                  "n": ("lazy_vote", False), "p": ("partial_loads", True), "t": ("narrow_tiles", True),
                  "w": ("narrow_tiles", False), "x": ("packed_steps", True), "h": ("l2_hints", True),
                 "V": ("probe_loads", "skip_v"), "K": ("probe_loads", "skip_kv"), "Z": ("probe_loads", "tile0"),
                 "W": ("probe_loads", "win16")}


def reorder_lists(idx, num, order: str, seed: int = 0):
    """The q2k lists ``idx`` ``(..., W)`` (``map_to_index``'s: each row's ``num`` selected kv tiles first, in
    ascending order, then the rest) with each row's selected entries in another walk order: ``sorted`` (as
    built), ``reversed`` or ``shuffled`` (a seeded permutation a row); the entries past ``num`` keep their
    places. The same set a row, so the same output up to the sum's rounding: a locality measurement (do
    CTAs that start together gain from reading neighbouring tiles at the same step?)."""
    import torch

    if order == "sorted":
        return idx
    if order not in ("reversed", "shuffled"):
        raise SystemExit(f"bad --orders entry {order!r} (sorted, reversed, shuffled)")
    width = idx.shape[-1]
    pos = torch.arange(width, device=idx.device).expand_as(idx)
    valid = pos < num.unsqueeze(-1)
    if order == "reversed":
        key = torch.where(valid, -pos, width + pos).double()
    else:
        g = torch.Generator(device=idx.device).manual_seed(seed)
        key = torch.where(valid, torch.rand(idx.shape, device=idx.device, generator=g, dtype=torch.float64),
                          2.0 + pos.double())
    return idx.gather(-1, key.argsort(dim=-1)).contiguous()


def parse_variant(spec: str) -> dict:
    """``"k2v3c2st"`` -> k_stages=2, v_stages=3, ctas_per_sm=2, stmatrix_epilogue=True; ``q112`` ->
    q_regs=112 (Q's first 112 columns in registers: those k-steps of S as RS wgmma; ``q`` alone:
    128); the flags ``l`` / ``e`` (lazy_rescale on / off), ``u`` / ``n`` (lazy_vote on / off) and
    ``p`` (partial_loads), ``t`` / ``w`` (narrow_tiles on / off), ``x`` (packed_steps: the lists
    packed by ``pack_steps`` inside the timed call) and ``h`` (l2_hints: L2 policies on the TMA copies) anywhere, and the timing probes ``V`` / ``K`` / ``Z``
    (probe_loads skip_v / skip_kv / tile0: wrong outputs, the loop's bytes cut or always hit; ``W``:
    every load from a window of 16 tiles a head; ``win<n>``: of n tiles), ``rot<n>`` (rotate_walk=n: each
    CTA's walk started at a position set by its launch order among n resident CTAs), ``pf<n>`` (tile_prefetch=n:
    list entry j + n's K and V tiles asked into the L2 at step j), e.g.
    ``"q112l"`` (the kernel's defaults for what is left out; ``"base"`` is the default build)."""
    import re

    out, rest = {}, spec
    if rest == "base":
        return out
    # the numbered words first (their letters would read as one-letter flags): the working-set probe at any
    # window, rotate_walk (resident CTAs a wave), tile_prefetch (list entries ahead)
    for word, key, value in (("win", "probe_loads", lambda n: f"win{n}"), ("rot", "rotate_walk", int),
                             ("pf", "tile_prefetch", int)):
        m = re.search(word + r"(\d+)", rest)
        if m:
            out[key] = value(m.group(1))
            rest = rest[:m.start()] + rest[m.end():]
    if rest.endswith("st"):
        out["stmatrix_epilogue"], rest = True, rest[:-2]
    for key, val in re.findall(r"([kvc])(\d)", rest):
        out[_VARIANT_KEYS[key]] = int(val)
    rest = re.sub(r"[kvc]\d", "", rest)
    m = re.search(r"q(\d*)", rest)
    if m:
        out["q_regs"] = int(m.group(1) or 128)
        rest = rest[:m.start()] + rest[m.end():]
    for flag in rest:
        if flag not in _VARIANT_FLAGS:
            raise SystemExit(f"bad --variants entry {spec!r} (e.g. k2v3c2st, q112l, base)")
        key, val = _VARIANT_FLAGS[flag]
        out[key] = val
    return out


def exactness(variant=None):
    import torch

    from fastvideo_cute import reference
    from fastvideo_cute.metadata import map_to_index

    res = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    for bshd in (False, True):
        for (B, H, SQ, SK) in ((2, 3, 1024, 1024), (1, 2, 512, 1280)):
            qb, kb = SQ // 64, SK // 64
            shp = (lambda s: (B, s, H, 128)) if bshd else (lambda s: (B, H, s, 128))
            q = torch.randn(shp(SQ), device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(shp(SK), device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            bm = torch.rand(B, H, qb, kb, device="cuda", generator=g) < 0.35
            bm[0, 0, 1] = False  # a query tile with no entry
            sizes = torch.full((kb,), 64, dtype=torch.int32, device="cuda")
            sizes[2], sizes[5], sizes[-1] = 0, 17, 41
            bm[..., 2] |= True  # the empty block selected everywhere
            bm[0, 0, 1] = False
            pos = torch.arange(SK, device="cuda")
            pad = (pos % 64) >= sizes.repeat_interleave(64)
            sel = (slice(None), pad) if bshd else (slice(None), slice(None), pad)
            k[sel] = float("nan")
            v[sel] = float("inf")
            idx, num = map_to_index(bm)
            out, lse = ours(q, k, v, idx.to(torch.int32).contiguous(), num.to(torch.int32).contiguous(), sizes,
                            bshd=bshd, variant=variant)
            t = (lambda x: x.transpose(1, 2)) if bshd else (lambda x: x)
            ro, rl = reference.block_sparse_attn_reference(t(q).float(), t(k).float(), t(v).float(), bm, sizes, 64)
            o = t(out).float()
            name = f"{'bshd' if bshd else 'bhsd'}-B{B}H{H}-{SQ}x{SK}"
            res[name] = {
                "finite_out": bool(torch.isfinite(o).all()),
                "max_abs_err_out": float((o - ro).abs().max()),
                "max_abs_err_lse": float((lse - rl).abs()[torch.isfinite(rl)].max()),
                "empty_row_ok": bool((o[0, 0, 64:128] == 0).all() and torch.isneginf(lse[0, 0, 64:128]).all()),
                "lse_inf_match": bool((torch.isneginf(lse) == torch.isneginf(rl)).all()),
            }
            print(name, res[name], flush=True)
    return res


def bench_rounds(fns, args):
    """Median time (ms) of each callable over ``args.rounds`` interleaved rounds (every entry once
    per round, in order), so that no entry is always measured first: one measured right after
    another kernel's timing loop ran up to 6 % slower than the same code timed later in the same
    run (``benchmarks/results/fwd64_sm90_h200_v4.json``: the default pipeline at 1.553 ms, the
    identical ``c2`` build at 1.459 ms). Each round starts one entry later than the last (the GPU's
    clock drifts over a run: cuDNN's entry measured 1.42 to 1.63 ms over three rounds of one run,
    ``fwd64_sm90_h200_v8.json``); :func:`round_ratios` compares entries round by round. Every entry
    starts settled (``bench_vsa.settle``, ``args.settle`` seconds, 0.5 without it): in the H100 tables the
    entry timed right after FastVideo's ran 3 % slower on average, up to 28 % in one round."""
    import statistics

    from triton.testing import do_bench

    from bench_vsa import settle  # sync, empty_cache and a pause between entries (bench_vsa --settle)

    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(args.rounds):  # each round starts one entry later: no entry is always first
        for name in names[r % len(names):] + names[:r % len(names)]:
            settle(getattr(args, "settle", 0.5))
            times[name].append(do_bench(fns[name], warmup=args.warmup, rep=args.rep))
    return {name: statistics.median(ts) for name, ts in times.items()}, times


def round_ratios(all_ms, ref):
    """Per entry: the median over rounds of (``ref``'s time / the entry's time) in the same round."""
    import statistics

    return {name: statistics.median(r / t for r, t in zip(all_ms[ref], ts)) for name, ts in all_ms.items()}


def timing(args):
    import torch

    from bench_vsa import Case
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.adapters.cudnn_bsa_metadata import build_cudnn_metadata
    from fastvideo_cute.kernels.triton.sanitize_padding import sanitize_kv_padding
    from fastvideo_cute.kernels.triton.vsa_gate import vsa_gate_fwd
    from fastvideo_cute.metadata import map_to_index

    rows = []
    cargs = types.SimpleNamespace(grid=[21, 30, 52], dtype="bf16", batch=1, heads=12, head_dim=128, seed=0, ragged=False)
    for S, tile in ((32768, None), (65536, None), (None, (4, 4, 4))):
        case = Case(cargs, S or 32768, 64, 0.875, "cuda", tile=tile)
        q, k, v = (case.bshd(t) for t in (case.q, case.k, case.v))
        idx, num = map_to_index(case.block_map)
        idx, num = idx.to(torch.int32).contiguous(), num.to(torch.int32).contiguous()
        sizes = None if case.all_full else case.sizes.to(torch.int32)
        tsz = case.sizes.to(torch.int32).contiguous()
        all_full = case.all_full
        cm = build_cudnn_metadata(idx, num, case.sizes, block_size=64, batch=1, heads=12, q_len=case.seqlen,
                                  kv_len=case.seqlen, all_full=case.all_full)
        o_c, l_c = C.cudnn_fwd_prebuilt(q, k, v, cm, bshd=True, softmax_scale=None)
        o_o, l_o = ours(q, k, v, idx, num, sizes, bshd=True)
        fns = {"cudnn": lambda: C.cudnn_fwd_prebuilt(q, k, v, cm, bshd=True, softmax_scale=None),
               "ours": lambda: ours(q, k, v, idx, num, sizes, bshd=True)}
        row = {"seqlen": case.seqlen, "tile": tile, "flops": case.flops["fwd"],
               "max_abs_diff_out": float((o_o.float() - o_c.float()).abs().max()),
               "max_abs_diff_lse": float((l_o - l_c).abs().max())}
        equal = {}
        for spec in args.variants:  # the pipeline sweep: same math, other ring depths / occupancy
            var = parse_variant(spec)
            o_v, l_v = ours(q, k, v, idx, num, sizes, bshd=True, variant=var)
            equal[spec] = bool(torch.equal(o_v, o_o) and torch.equal(l_v, l_o))
            fns[f"ours[{spec}]"] = (lambda var=var: ours(q, k, v, idx, num, sizes, bshd=True, variant=var))
        for order in args.orders:  # the same lists walked in another order (a locality measurement)
            idx_r = reorder_lists(idx, num, order)
            o_r, _ = ours(q, k, v, idx_r, num, sizes, bshd=True)
            row.setdefault("orders_max_abs_diff_out", {})[order] = float((o_r.float() - o_o.float()).abs().max())
            fns[f"ours[order:{order}]"] = (lambda idx_r=idx_r: ours(q, k, v, idx_r, num, sizes, bshd=True))
        if args.bhsd:  # the same case in BHSD (a head's K / V contiguous): does the address span matter?
            qh, kh, vh = case.q, case.k, case.v
            o_h, _ = ours(qh, kh, vh, idx, num, sizes, bshd=False)
            row["bhsd_max_abs_diff_out"] = float((o_h.transpose(1, 2).float() - o_o.float()).abs().max())
            fns["ours[layout:bhsd]"] = lambda: ours(qh, kh, vh, idx, num, sizes, bshd=False)
            fns["cudnn[layout:bhsd]"] = lambda: C.cudnn_fwd_prebuilt(qh, kh, vh, cm, bshd=False, softmax_scale=None)
        for n in args.kv_splits:  # the kv-range split of the adapter (one launch per range, merged)
            o_s, l_s = ours(q, k, v, idx, num, sizes, bshd=True, kv_splits=n)
            row.setdefault("kv_splits_max_abs_diff_out", {})[str(n)] = float((o_s.float() - o_o.float()).abs().max())
            fns[f"ours[kv{n}]"] = (lambda n=n: ours(q, k, v, idx, num, sizes, bshd=True, kv_splits=n))
        if not case.all_full:  # what the library's cuDNN route pays on top: V's padding zeroed
            fns["cudnn+v_copy"] = lambda: (sanitize_kv_padding(None, v, tsz, 64, bshd=True),
                                           C.cudnn_fwd_prebuilt(q, k, v, cm, bshd=True, softmax_scale=None))
        if args.gate:  # VSA's gate composition: cuDNN + V's copy + the gate pass vs ours with it fused
            g = torch.Generator(device="cuda").manual_seed(11)
            gate = torch.rand(q.shape, device="cuda", dtype=q.dtype, generator=g)
            b, s, h, d = q.shape
            out_c = torch.randn(b, h, s // 64, d, device="cuda", dtype=q.dtype, generator=g)
            out = torch.empty_like(q)

            def cudnn_path():
                vv = v if all_full else sanitize_kv_padding(None, v, tsz, 64, bshd=True)[1]
                o, _ = C.cudnn_fwd_prebuilt(q, k, vv, cm, bshd=True, softmax_scale=None)
                vsa_gate_fwd(o.transpose(1, 2), out_c, gate.transpose(1, 2), out.transpose(1, 2), block=64,
                             config={"num_warps": 8})
                return out

            fused = ours(q, k, v, idx, num, sizes, bshd=True, gate=gate, out_c=out_c)[0]
            row["gate_max_abs_diff"] = float((fused.float() - cudnn_path().float()).abs().max())
            fns["gate:cudnn_path"] = cudnn_path
            fns["gate:fused"] = lambda: ours(q, k, v, idx, num, sizes, bshd=True, gate=gate, out_c=out_c)
            for spec in args.variants:
                var = parse_variant(spec)
                f_v = ours(q, k, v, idx, num, sizes, bshd=True, gate=gate, out_c=out_c, variant=var)[0]
                equal[f"gate:{spec}"] = bool(torch.equal(f_v, fused))
                fns[f"gate:fused[{spec}]"] = (lambda var=var: ours(q, k, v, idx, num, sizes, bshd=True, gate=gate,
                                                                   out_c=out_c, variant=var))
        med, all_ms = bench_rounds(fns, args)
        ms_c, ms_o = med["cudnn"], med["ours"]
        row.update({"rounds": args.rounds, "ms_median": med, "ms_all": all_ms,
                    "round_ratio_vs_cudnn": round_ratios(all_ms, "cudnn"),
                    "cudnn_ms": ms_c, "ours_ms": ms_o, "cudnn_tflops": case.flops["fwd"] / ms_c / 1e9,
                    "ours_tflops": case.flops["fwd"] / ms_o / 1e9, "ours_vs_cudnn": ms_c / ms_o})
        for spec in args.variants:
            ms_v = med[f"ours[{spec}]"]
            row.setdefault("variants", {})[spec] = {"ms": ms_v, "vs_cudnn": ms_c / ms_v, "vs_base": ms_o / ms_v,
                                                    "bitwise_equal_base": equal[spec]}
        for order in args.orders:
            ms_r = med[f"ours[order:{order}]"]
            row.setdefault("orders", {})[order] = {"ms": ms_r, "vs_cudnn": ms_c / ms_r, "vs_sorted": ms_o / ms_r}
        if args.bhsd:
            row["bhsd"] = {"ours_ms": med["ours[layout:bhsd]"], "cudnn_ms": med["cudnn[layout:bhsd]"],
                           "ours_vs_cudnn": med["cudnn[layout:bhsd]"] / med["ours[layout:bhsd]"],
                           "ours_bshd_over_bhsd": ms_o / med["ours[layout:bhsd]"]}
        if "cudnn+v_copy" in med:
            row["cudnn_with_v_copy_ms"] = med["cudnn+v_copy"]
            row["ours_vs_cudnn_with_v_copy"] = med["cudnn+v_copy"] / ms_o
        if args.gate:
            row["gate_cudnn_path_ms"], row["gate_fused_ms"] = med["gate:cudnn_path"], med["gate:fused"]
            row["gate_fused_vs_cudnn_path"] = med["gate:cudnn_path"] / med["gate:fused"]
            for spec in args.variants:
                ms_g = med[f"gate:fused[{spec}]"]
                row["variants"][spec].update({"gate_fused_ms": ms_g, "gate_vs_cudnn_path": med["gate:cudnn_path"] / ms_g,
                                              "gate_vs_base": med["gate:fused"] / ms_g,
                                              "gate_bitwise_equal_base": equal[f"gate:{spec}"]})
        print(json.dumps({k: v for k, v in row.items() if k != "ms_all"}), flush=True)
        rows.append(row)
        del case
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--orders", nargs="*", default=[],
                    help="time the default on the same lists walked reversed / shuffled within each row")
    ap.add_argument("--bhsd", action="store_true",
                    help="also time ours and cuDNN on the same case in BHSD (the table's layout; the rest is BSHD)")
    ap.add_argument("--kv-splits", type=int, nargs="*", default=[],
                    help="also time the adapter's kv-range split forward with these range counts")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rep", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per case (median kept)")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--no-gate", dest="gate", action="store_false",
                    help="skip the gate-composition comparison (cuDNN path vs the fused epilogue)")
    ap.add_argument("--variants", nargs="*", default=[],
                    help="pipeline variants to time beside the default (e.g. k2c2 k2v3c2 st): ring depths "
                         "k/v, CTAs per SM c, st = stmatrix epilogue; each also gets the exactness checks")
    args = ap.parse_args(argv)
    import torch

    res = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("FVC_COMMIT"), "exactness": exactness()}
    for spec in args.variants:
        res.setdefault("exactness_variants", {})[spec] = exactness(parse_variant(spec))
    if not args.skip_timing:
        res["timing"] = timing(args)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
