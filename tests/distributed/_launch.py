"""Spawn ``world`` processes with ``torch.multiprocessing`` (start method ``spawn``), one process
group over a file rendezvous (no ports), run one job per rank, and hand back each rank's result.

A job is ``tests.distributed._jobs.<name>(rank, world, *args) -> picklable``; each rank saves its
result with ``torch.save`` and the parent loads them. gloo children switch on the Triton
interpreter before anything imports ``fastvideo_cute`` and use one thread each (the CI box has two
cores); NCCL children take GPU ``rank``; ``"gloo-cuda"`` runs gloo with every rank on GPU 0 (CUDA
tensors, real kernels: the pipeline on one GPU). A child that raises or outlives ``timeout`` fails the call
with its traceback.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback
from pathlib import Path
from typing import Any, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _worker(rank: int, world: int, backend: str, job: str, args: tuple, tmpdir: str) -> None:
    if backend == "gloo":
        os.environ["TRITON_INTERPRET"] = "1"
        torch.set_num_threads(1)
    elif backend == "gloo-cuda":
        torch.cuda.set_device(0)
    else:
        torch.cuda.set_device(rank)
    dist.init_process_group("gloo" if backend == "gloo-cuda" else backend, init_method=f"file://{tmpdir}/rendezvous",
                            rank=rank, world_size=world, timeout=datetime.timedelta(seconds=90))
    try:
        from tests.distributed import _jobs

        result: Any = getattr(_jobs, job)(rank, world, *args)
    except BaseException:  # noqa: BLE001 - reported to the parent
        result = {"__error__": traceback.format_exc()}
    torch.save(result, Path(tmpdir) / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def launch(world: int, backend: str, job: str, args: tuple, tmpdir: Path, timeout: float = 240.0) -> List[Any]:
    tmpdir.mkdir(parents=True, exist_ok=True)
    ctx = mp.start_processes(_worker, args=(world, backend, job, args, str(tmpdir)), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.terminate()
            raise TimeoutError(f"{world}-rank {backend} job {job!r} did not finish within {timeout:.0f} s")
    results = [torch.load(tmpdir / f"rank{r}.pt", weights_only=False) for r in range(world)]
    for r, res in enumerate(results):
        if isinstance(res, dict) and "__error__" in res:
            raise RuntimeError(f"rank {r} of {world} failed:\n{res['__error__']}")
    return results
