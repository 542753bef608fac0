# SPDX-License-Identifier: Apache-2.0
"""The split 64-token backward (sm_90a) beside the route's and cuDNN's, on the H200.

Split: the kv-owned main kernel (``BlockSparseBwd64Sm90Ws(ds_out=True)``) stores each pair's bf16 dS
tile (8 KB) in q-owned order instead of reduce-adding a 32 KB fp32 dQ tile; the q-owned
``BlockSparseDq64Sm90`` sums dQ = scale * sum_j dS_ij K_j from them in registers. The pair slots
(``adapters/cute_sm90_bwd64_split.chunk_slots``: one Triton launch) are part of the split's time and also
timed alone (``slots``); ``split`` runs the heads in chunks whose workspace fits the adapter's
cap, ``split_prebuilt`` in one chunk with the slots prebuilt, ``split_<variant>`` as ``split`` with another
build of the dQ kernel (``--dq-variants``, e.g. ``s4c2``: four ring slots, two CTAs per SM), ``split_g<v>`` with
the main kernel's lists split by q group (``--q-groups``, e.g. ``auto``), ``split_<variant>_g<v>`` both
(``--cross``), ``split_nol2`` without the default's L2 hint (dS stored and loaded evict_first) and
``split_l2dsk`` with K loaded evict_last as well (``--hints``), ``split_cap<GiB>`` with
another workspace cap (``--caps``: smaller chunks of heads). One q group otherwise. Rows: per case the
per-round ratio of cuDNN's time to each entry's, the max relative difference of dq/dk/dv from cuDNN's.

    python benchmarks/explore_ds_split.py --cases 32768 grid 65536 --rounds 3 --out results/x.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

def dq_variant(name: str, base: dict) -> dict:
    """``s<stages>c<ctas per SM>`` -> the dQ kernel's configuration (``base``, the adapter's, otherwise: its L2
    hint kept)."""
    m = re.fullmatch(r"s(\d)c(\d)", name)
    if m is None:
        raise SystemExit(f"--dq-variants: expected s<stages>c<ctas>, got {name!r}")
    return dict(base, stages=int(m.group(1)), ctas_per_sm=int(m.group(2)))


def main(argv=None) -> int:
    import torch

    import bench_vsa
    from explore_bwd64_sm90 import backward_case
    from explore_fwd64_sm90 import bench_rounds, round_ratios
    from fastvideo_cute.adapters import cudnn_bsa as C
    from fastvideo_cute.adapters.cute_sm90_bwd64 import sm90_block_sparse_bwd64
    from fastvideo_cute.backends.sm90_backend import _BWD_WS_CONFIG as ROUTE
    from fastvideo_cute.adapters.cute_sm90_bwd64_split import DQ_CONFIG, chunk_slots, sm90_block_sparse_bwd64_split
    from fastvideo_cute.metadata import map_to_index

    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--cases", nargs="+", default=["32768", "grid", "65536"])
    p.add_argument("--dq-variants", nargs="*", default=[],
                   help="more split entries, each with another dQ kernel build: s<stages>c<ctas per SM>, "
                        "e.g. s4c2 (entry split_s4c2; the adapter's DQ_CONFIG is the entry split)")
    p.add_argument("--q-groups", nargs="*", default=[],
                   help="more split entries with the main kernel's k2q lists split by q group: 'auto' (the route's "
                        "rule, cute_sm90_bwd64_ws.default_groups) or q blocks per group (entry split_g<value>)")
    p.add_argument("--caps", nargs="*", type=float, default=[],
                   help="more split entries with another workspace cap, in GiB (entry split_cap<value>; the adapter's "
                        "WORKSPACE_CAP is the entry split): the heads run in chunks whose dS workspace fits it")
    p.add_argument("--hints", action="store_true",
                   help="two more split entries for the L2 cache hints: split_nol2 (without the default's: the dS "
                        "tiles stored and loaded evict_first) and split_l2dsk (K loaded evict_last as well)")
    p.add_argument("--cross", action="store_true",
                   help="also every dQ build with every q-group value (entry split_<variant>_g<value>)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    variants = {name: dq_variant(name, DQ_CONFIG) for name in args.dq_variants}
    groups = [g if g == "auto" else int(g) for g in args.q_groups]
    rows = []
    for name in args.cases:
        case, q, k, v, do, sizes, kidx, knum, meta, o, lse = backward_case(name)
        b, h, s, d = q.shape
        nb = sizes.numel()
        qidx, qnum = map_to_index(case.block_map)
        qidx = qidx[..., :case.topk].contiguous()  # every row holds top-k entries: lists as wide as VSA's
        scale = d ** -0.5
        lse_c = lse.contiguous()
        cdq, cdk, cdv = (torch.empty_like(x) for x in (q, k, v))

        def cudnn():
            return C.cudnn_bwd_prebuilt(do, q, k, v, o, lse, meta, bshd=False, softmax_scale=None, dq=cdq, dk=cdk, dv=cdv)

        def route():
            return sm90_block_sparse_bwd64(q, k, v, o, do, lse_c, kidx, knum, sizes, main="ws", ws_config=dict(ROUTE))

        def slots():  # the adapter's (one Triton launch), all heads as one chunk
            return chunk_slots(qidx.reshape(b * h, nb, -1), qnum.reshape(b * h, nb), kidx.reshape(b * h, nb, -1),
                               knum.reshape(b * h, nb), nb)

        pairs = int(qnum.sum())
        prebuilt = slots()

        def split_prebuilt():
            return sm90_block_sparse_bwd64_split(q, k, v, o, do, lse_c, qidx, qnum, kidx, knum, sizes,
                                                 slots=prebuilt, workspace_cap=1 << 40)

        def split():
            return sm90_block_sparse_bwd64_split(q, k, v, o, do, lse_c, qidx, qnum, kidx, knum, sizes)

        def split_with(**kw):  # the split with one more adapter argument (a dQ build, q groups)
            return lambda: sm90_block_sparse_bwd64_split(q, k, v, o, do, lse_c, qidx, qnum, kidx, knum, sizes, **kw)

        entries = {"cudnn": cudnn, "route": route, "split": split, "split_prebuilt": split_prebuilt, "slots": slots}
        entries.update({f"split_{name}": split_with(dq_config=cfg) for name, cfg in variants.items()})
        entries.update({f"split_g{g}": split_with(q_groups=g) for g in groups})
        entries.update({f"split_cap{c:g}": split_with(workspace_cap=int(c * (1 << 30))) for c in args.caps})
        if args.hints:
            off = {"ds_evict_first": False}
            entries["split_nol2"] = split_with(dq_config=dict(DQ_CONFIG, **off), main_config=off)
            entries["split_l2dsk"] = split_with(dq_config=dict(DQ_CONFIG, k_evict_last=True))
        if args.cross:
            entries.update({f"split_{name}_g{g}": split_with(dq_config=cfg, q_groups=g)
                            for name, cfg in variants.items() for g in groups})
        ref = [t.clone() for t in cudnn()]
        err, finite = {}, {}
        for key in [e for e in entries if e not in ("cudnn", "slots")]:
            got = entries[key]()
            torch.cuda.synchronize()
            err[key] = {n: ((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
                        for n, g, r in zip(("dq", "dk", "dv"), got, ref)}
            finite[key] = all(bool(torch.isfinite(g).all()) for g in got)
        base = split()
        bitwise_dq = bool(torch.equal(base[0], split()[0]))

        def same_bits(key, parts=3):  # the entry's first ``parts`` of (dq, dk, dv) bit for bit those of ``base``
            return all(bool(torch.equal(a, b)) for a, b in zip(entries[key]()[:parts], base[:parts]))

        same_as_split = {f"split_{n}": same_bits(f"split_{n}") for n in variants}  # another dQ build
        same_as_split.update({n: same_bits(n) for n in ("split_nol2", "split_l2dsk") if n in entries})  # hints
        same_as_split.update({f"split_g{g}_dq": same_bits(f"split_g{g}", 1)
                              for g in groups})  # q groups: dq the same bits (dk/dv: ticket order)
        med, times = bench_rounds(entries, args)
        ratio = round_ratios(times, "cudnn")
        row = {"case": name, "seqlen": s, "pairs": pairs, "workspace_gb": pairs * 8192 / 1e9, "ms_median": med,
               "ms_rounds": times, "round_ratio_vs_cudnn": ratio, "max_rel_diff_vs_cudnn": err, "finite": finite,
               "split_dq_bitwise_run_to_run": bitwise_dq, "variant_bitwise_equal_split": same_as_split}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del case
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({"env": bench_vsa.environment(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
