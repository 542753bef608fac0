"""Why the lists' forward (block_sparse_attn_from_indices) is slower than the map's at 32K/64K:
API calls, glue alone, the kernel on each list form; do_bench (L2 flushed), 3 interleaved rounds;
then the profiler's kernel table of one API call each. Needs an sm_90 GPU and the CuTe stack:

  python benchmarks/ab_lists_fwd.py > diag_lists_fwd.log
"""
import time
import torch
from triton.testing import do_bench
from torch.profiler import profile, ProfilerActivity
import fastvideo_cute as fvc
from fastvideo_cute import api_indices
from fastvideo_cute.api_indices import ascending_lists
from fastvideo_cute.kernels.triton.ascending_lists import ascending_lists_triton
from fastvideo_cute.metadata import map_to_index
from fastvideo_cute.adapters.cute_sm90_fwd64 import sm90_fwd64, auto_kv_splits


def _sort_by(triton_sort: bool, fn):
    """fn run with api_indices.TRITON_SORT set to ``triton_sort`` (the one-launch Triton row sort, or
    the torch ops), restored after: both paths timed in one run whatever the module's default."""
    def run():
        old, api_indices.TRITON_SORT = api_indices.TRITON_SORT, triton_sort
        try:
            return fn()
        finally:
            api_indices.TRITON_SORT = old
    return run


def main() -> None:
    b, h, d = 1, 12, 128
    for S in (32768, 65536):
        nb = S // 64
        topk = nb // 8
        g = torch.Generator(device="cuda").manual_seed(S)
        q, k, v = (torch.randn(b, h, S, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        sel = torch.rand(b, h, nb, nb, device="cuda", generator=g).topk(topk, dim=-1).indices
        bm = torch.zeros(b, h, nb, nb, dtype=torch.bool, device="cuda").scatter_(-1, sel, True)
        idx, num = sel.to(torch.int32), torch.full((b, h, nb), topk, dtype=torch.int32, device="cuda")
        sizes = torch.full((nb,), 64, dtype=torch.int32, device="cuda")
        ai, an = ascending_lists(idx, num, nb, b)
        mi, mn = map_to_index(bm)
        sp_t = auto_kv_splits(q.device, S, S, d, 2, ai.shape[-1])
        sp_m = auto_kv_splits(q.device, S, S, d, 2, mi.shape[-1])
        print(f"S={S} kv_splits topk-lists {sp_t} map-lists {sp_m}; widths {ai.shape[-1]} {mi.shape[-1]}", flush=True)
        with torch.no_grad():
            o1 = fvc.block_sparse_attn(q, k, v, bm, sizes)[0]
            o2 = _sort_by(False, lambda: fvc.block_sparse_attn_from_indices(q, k, v, idx, num, sizes))()[0]
            o3 = _sort_by(True, lambda: fvc.block_sparse_attn_from_indices(q, k, v, idx, num, sizes))()[0]
            print("outputs bitwise equal: torch sort", torch.equal(o1, o2), "Triton sort", torch.equal(o1, o3))
            fns = {
                "map_api": lambda: fvc.block_sparse_attn(q, k, v, bm, sizes),
                "lists_api": _sort_by(False, lambda: fvc.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)),
                "lists_api_tsort": _sort_by(True, lambda: fvc.block_sparse_attn_from_indices(q, k, v, idx, num, sizes)),
                "ascending_lists": _sort_by(False, lambda: ascending_lists(idx, num, nb, b)),
                "ascending_tsort": _sort_by(True, lambda: ascending_lists(idx, num, nb, b)),
                "rows_triton": lambda: ascending_lists_triton(idx, num, nb),
                "map_to_index": lambda: map_to_index(bm),
                "kernel_topk_lists": lambda: sm90_fwd64(q, k, v, ai, an, None, bshd=False, kv_splits=sp_t),
                "kernel_map_lists": lambda: sm90_fwd64(q, k, v, mi, mn, None, bshd=False, kv_splits=sp_m),
            }
            res = {n: [] for n in fns}
            for r in range(3):
                for n, fn in fns.items():
                    res[n].append(do_bench(fn, warmup=25, rep=100))
            host = {}
            for n, fn in fns.items():  # host time per call, launches only (the queue is far from full)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(10):
                    fn()
                host[n] = (time.perf_counter() - t0) / 10 * 1e6
                torch.cuda.synchronize()
            for n, ts in res.items():
                rounds = [round(t, 4) for t in ts]
                print(f"  {n:20s} {sorted(ts)[1]:.4f} ms  rounds {rounds}  host {host[n]:.0f} us/call", flush=True)
            if S == 32768:
                for n in ("map_api", "lists_api", "lists_api_tsort"):
                    for _ in range(3):
                        fns[n]()
                    torch.cuda.synchronize()
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        for _ in range(10):
                            fns[n]()
                        torch.cuda.synchronize()
                    print(f"--- {n} (10 calls)")
                    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
