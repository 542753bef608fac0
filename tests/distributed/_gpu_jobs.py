"""What each NCCL rank runs for ``test_gpu_ulysses_nccl.py``: every GPU case on one route.

Per case, on its own GPU, a rank computes

- its Ulysses slice (out, lse, grads);
- the single-GPU call for every head group some rank's attention call saw (rank j's heads, chunk
  by chunk), twice: if the two runs agree bit for bit the route is deterministic for this call,
  and the rank's slice must then equal them bit for bit (the same call on the same data);
- the fp32 torch reference on the whole sequence: the rank's slice and the single-GPU all-heads
  call must both be within the route's tolerance of it.

Only small summaries go back to the parent (flags and errors).
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Dict

import torch

from tests.distributed._cases import GPU_CASES, build, grad_names, result_seq_dim, run_single, run_ulysses


def _set_route(route: str) -> None:
    for var in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        os.environ.pop(var, None)
    if route == "cute":
        os.environ["FASTVIDEO_VSA_CUTEDSL"] = "1"
    elif route == "triton":
        # forced: the default follows the route table (cuDNN / FA4 on the H200, whose backwards
        # accumulate with atomics), and these checks need the deterministic route
        os.environ["FASTVIDEO_VSA_TRITON"] = "1"
    else:
        raise ValueError(route)


def _nerr(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (as tests/test_gpu_cute_route.py measures)."""
    a, b = a.float(), b.float()
    fin = torch.isfinite(b)
    return ((a - b)[fin].abs().max() / b[fin].abs().max().clamp(min=1e-6)).item()


def _reference(case, t) -> Dict[str, torch.Tensor]:
    from fastvideo_cute.reference import block_sparse_attn_reference, video_sparse_attn_reference

    tb = (lambda x: x.transpose(1, 2)) if case.bshd else (lambda x: x)
    leaves = [tb(t[n]).float().clone().requires_grad_(case.grad) for n in grad_names(case)]
    with torch.set_grad_enabled(case.grad):
        if case.kind == "vsa":
            gate = leaves[3] if case.gate else None
            out = video_sparse_attn_reference(*leaves[:3], t["sizes"], t["q_sizes"], case.topk, case.block, gate)
            lse = None
        else:
            out, lse = block_sparse_attn_reference(*leaves, t["map"], t["sizes"], case.block)
    res = {"out": tb(out.detach())}
    if lse is not None:
        res["lse"] = lse
    if case.grad:
        grads = torch.autograd.grad(out, leaves, tb(t["dout"]).float())
        res.update({"d" + n: tb(g) for n, g in zip(grad_names(case), grads)})
    return res


def _one_case(case, rank: int, world: int, device: str) -> Dict[str, Any]:
    t = build(case, device)
    mine = run_ulysses(case, t, rank, world)
    hl = case.heads // world
    chunks = min(case.chunks, hl)
    from fastvideo_cute.distributed.pipeline import chunk_bounds

    hd = case.head_dim_index()
    deterministic, bitwise = True, True
    for j in range(world):
        for lo, hi in chunk_bounds(hl, chunks):
            heads = slice(j * hl + lo, j * hl + hi)
            first = run_single(case, t, heads=heads)
            second = run_single(case, t, heads=heads)
            for key, val in first.items():
                deterministic &= torch.equal(val, second[key])
                dim = result_seq_dim(case, key)
                n = val.shape[dim] // world
                unit = val.narrow(dim, rank * n, n)
                hdim = 1 if key == "lse" else hd
                got = mine[key].narrow(hdim, heads.start, heads.stop - heads.start)
                bitwise &= torch.equal(got, unit)
    single = run_single(case, t)
    ref = _reference(case, t)
    errs, single_errs = {}, {}
    for key, want in ref.items():
        dim = result_seq_dim(case, key)
        n = want.shape[dim] // world
        if key == "lse":
            fin = torch.isfinite(want.narrow(dim, rank * n, n))
            errs["lse_inf_match"] = bool(torch.equal(torch.isneginf(mine["lse"]), ~fin))
            continue
        errs[key] = _nerr(mine[key], want.narrow(dim, rank * n, n))
        single_errs[key] = _nerr(single[key], want)
    return {"deterministic": bool(deterministic), "bitwise_vs_single": bool(bitwise), "errs": errs,
            "single_errs": single_errs}


def parity_suite(rank: int, world: int, route: str, device: str, cases=None) -> Dict[str, Any]:
    """``cases``: Case objects (default: GPU_CASES); ``device``: "cuda" (this rank's GPU) or "cpu"
    (a gloo dry run of the same checks, fp32 cases only: the interpreter's bf16 is wrong)."""
    _set_route(route)
    device = f"cuda:{rank}" if device == "cuda" else device
    out: Dict[str, Any] = {}
    for case in (cases if cases is not None else GPU_CASES.values()):
        if case.heads % world:
            continue
        try:
            out[case.name] = _one_case(case, rank, world, device)
        except Exception:  # noqa: BLE001 - reported per case by the parent
            out[case.name] = traceback.format_exc()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return out
