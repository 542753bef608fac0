"""Ulysses with CUDA tensors on ONE GPU: 2 spawned ranks share GPU 0 over gloo (NCCL refuses two
ranks on one GPU). The same checks as test_gpu_ulysses_nccl.py (``_gpu_jobs.py``) on the Triton
route: the pipeline, the packing and the autograd with real GPU kernels, bf16, where only one GPU
is lent. What it does not cover: NCCL itself and its streams (test_gpu_ulysses_nccl.py).

Run: ``python -m pytest -q -s tests/distributed/test_gpu_ulysses_one_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from tests.distributed._cases import GPU_CASES
from tests.distributed._launch import launch

pytestmark = pytest.mark.gpu
OUT_TOL, GRAD_TOL = 1e-2, 2e-2  # as tests/test_gpu_cute_route.py (bf16)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return launch(2, "gloo-cuda", "nccl_suite", ("triton", "cuda:0"), tmp_path_factory.mktemp("gloo_cuda"),
                  timeout=540.0)


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_one_gpu_two_ranks_parity(results, name):
    for rank, res in enumerate(results):
        r = res[name]
        assert not isinstance(r, str), f"rank {rank} failed {name}:\n{r}"
        print(f"\n[gloo on one GPU, {name}, rank {rank}] deterministic={r['deterministic']} "
              f"bitwise={r['bitwise_vs_single']} errs={r['errs']}")
        assert r["deterministic"], "two single-GPU Triton runs differ"
        assert r["bitwise_vs_single"], f"rank {rank}: {name} differs from the single-GPU call"
        for key, err in r["errs"].items():
            if key == "lse_inf_match":
                assert err
                continue
            tol = OUT_TOL if key == "out" else GRAD_TOL
            assert err < tol, f"rank {rank}: {name} {key} error {err:.2e} >= {tol}"
