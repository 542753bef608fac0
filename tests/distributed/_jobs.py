"""What each spawned rank runs (``_launch.launch(world, backend, "<name>", args, tmpdir)``).

``gloo_suite``: the argument errors (first: they must raise before any collective, or the cases
after them would desync), the size-1-group pass-through, then the CPU cases of ``_cases.CPU_PLAN``;
it returns this rank's slices for the parent to compare with the single-process call.
``nccl_suite``: the GPU parity checks of ``_gpu_jobs.py``.
"""

from __future__ import annotations

import traceback
from typing import Any, Dict

import torch
import torch.distributed as dist

from tests.distributed._cases import CPU_CASES, CPU_PLAN, build, run_ulysses


def _catch(fn) -> Any:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the parent checks type and message
        return (type(e).__name__, str(e))
    return None


def error_checks(world: int) -> Dict[str, Any]:
    import fastvideo_cute.distributed as fvd

    def x(h, s):
        return torch.randn(1, h, s, 32)

    sizes = torch.full((world,), 64, dtype=torch.int32)
    ok = x(4, 64)
    vsa = fvd.ulysses_video_sparse_attn
    bs = fvd.ulysses_block_sparse_attn
    full_map = torch.ones(1, 4, world, world, dtype=torch.bool)
    return {
        "heads": _catch(lambda: vsa(x(3, 64), x(3, 64), x(3, 64), sizes, sizes, 1, 64)),
        "slice": _catch(lambda: vsa(x(4, 96), x(4, 96), x(4, 96), sizes, sizes, 1, 64)),
        "local_sizes": _catch(lambda: vsa(ok, ok, ok, sizes[:1], sizes, 1, 64)),
        "q_local_sizes": _catch(lambda: vsa(ok, ok, ok, sizes, sizes[:1], 1, 64)),
        "layout": _catch(lambda: vsa(ok, ok, ok, sizes, sizes, 1, 64, layout="sbhd")),
        "gate_dtype": _catch(lambda: vsa(ok, ok, ok, sizes, sizes, 1, 64, ok.half())),
        "head_chunks": _catch(lambda: vsa(ok, ok, ok, sizes, sizes, 1, 64, head_chunks=4 // world + 1)),
        "map_heads": _catch(lambda: bs(ok, ok, ok, full_map[:, :3], sizes)),
        "map_local_seq": _catch(lambda: bs(ok, ok, ok, full_map[:, :, :1, :1], sizes)),
        "map_dtype": _catch(lambda: bs(ok, ok, ok, full_map.int(), sizes)),
    }


def passthrough(rank: int, world: int) -> Dict[str, bool]:
    """Each rank's own group of one: the call must equal the single-process one and communicate
    nothing (all_to_all_single is replaced by a function that raises)."""
    import fastvideo_cute.distributed as fvd

    groups = [dist.new_group([r]) for r in range(world)]  # every rank creates every group
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 128, 1, 32, generator=g) for _ in range(3))
    t = {"q": q, "k": k, "v": v, "map": torch.tensor([[[True, False], [True, True]]]),
         "sizes": torch.tensor([64, 40], dtype=torch.int32)}
    real = dist.all_to_all_single

    def forbidden(*a, **k):
        raise AssertionError("a group of one must not communicate")

    dist.all_to_all_single = forbidden
    try:
        with torch.no_grad():
            out, lse = fvd.ulysses_block_sparse_attn_bshd(t["q"], t["k"], t["v"], t["map"], t["sizes"],
                                                          group=groups[rank])
    finally:
        dist.all_to_all_single = real
    same = None
    if rank == 0:  # one rank compares (the interpreter is slow); the others only check no communication
        import fastvideo_cute as fvc

        with torch.no_grad():
            ref, ref_lse = fvc.block_sparse_attn_bshd(t["q"], t["k"], t["v"], t["map"], t["sizes"])
        same = torch.equal(out, ref) and torch.equal(lse, ref_lse)
    return {"size": dist.get_world_size(groups[rank]), "equal": same}


def gloo_suite(rank: int, world: int) -> Dict[str, Any]:
    result: Dict[str, Any] = {"errors": error_checks(world), "passthrough": passthrough(rank, world), "cases": {}}
    for name in CPU_PLAN[world]:
        case = CPU_CASES[name]
        try:
            result["cases"][name] = run_ulysses(case, build(case, "cpu"), rank, world)
        except Exception:  # noqa: BLE001 - reported per case by the parent
            result["cases"][name] = traceback.format_exc()
    return result


def nccl_suite(rank: int, world: int, route: str, device: str = "cuda", cases=None) -> Dict[str, Any]:
    from tests.distributed._gpu_jobs import parity_suite

    return parity_suite(rank, world, route, device, cases)

