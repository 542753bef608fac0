"""Ulysses over NCCL on 2, 4 and 8 GPUs (as many as the machine has): parity with one GPU, forward
and backward, on the Triton route and on the CuTe route (``FASTVIDEO_VSA_CUTEDSL=1``, when
``flash_attn.cute`` is installed; calls it cannot serve take Triton, as on one GPU).

Spawns its own ranks (``torch.multiprocessing``, one per GPU): run it with plain pytest,
``python -m pytest -q -s tests/distributed/test_gpu_ulysses_nccl.py`` (not under torchrun).
Skipped with fewer than 2 GPUs.

Per case and rank (``_gpu_jobs.py``): where the single-GPU call is deterministic (two runs
agree bit for bit: the Triton route, and every forward), the rank's slice equals it bit for bit;
always, the slice is within the route's tolerance of the fp32 reference, as the single-GPU call
is. Tolerances as tests/test_gpu_cute_route.py (bf16): 1e-2 out, 2e-2 gradients (max abs error
over max abs reference).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.distributed._cases import GPU_CASES
from tests.distributed._launch import launch

pytestmark = pytest.mark.gpu
OUT_TOL, GRAD_TOL = 1e-2, 2e-2
NGPU = torch.cuda.device_count() if torch.cuda.is_available() else 0
WORLDS = [p for p in (2, 4, 8) if p <= NGPU] or [2]


@pytest.fixture(scope="module", params=[(w, r) for w in WORLDS for r in ("triton", "cute")],
                ids=lambda p: f"{p[0]}gpu-{p[1]}")
def suite(request, tmp_path_factory):
    world, route = request.param
    if NGPU < world:
        pytest.skip(f"needs {world} GPUs, found {NGPU}")
    if not torch.distributed.is_nccl_available():
        pytest.skip("torch.distributed has no NCCL")
    if route == "cute" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attn.cute is not installed")
    results = launch(world, "nccl", "nccl_suite", (route,), tmp_path_factory.mktemp(f"nccl{world}{route}"),
                     timeout=540.0)
    return world, route, results


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_nccl_parity_with_one_gpu(suite, name):
    world, route, results = suite
    case = GPU_CASES[name]
    if case.heads % world:
        pytest.skip(f"{case.heads} heads do not divide over {world} ranks")
    for rank, res in enumerate(results):
        r = res[name]
        assert not isinstance(r, str), f"rank {rank} failed {name}:\n{r}"
        print(f"\n[{world} GPUs, {route}, {name}, rank {rank}] deterministic={r['deterministic']} "
              f"bitwise={r['bitwise_vs_single']} errs={r['errs']} single={r['single_errs']}")
        if route == "triton":  # deterministic by construction (docs/architecture.md#determinism)
            assert r["deterministic"], f"rank {rank}: two single-GPU Triton runs of {name} differ"
        if r["deterministic"]:
            assert r["bitwise_vs_single"], f"rank {rank}: {name} differs from the single-GPU call"
        for key, err in r["errs"].items():
            if key == "lse_inf_match":
                assert err, f"rank {rank}: -inf LSE rows differ from the reference's"
                continue
            tol = OUT_TOL if key == "out" else GRAD_TOL
            assert err < tol, f"rank {rank}: {name} {key} error {err:.2e} >= {tol}"
            assert r["single_errs"][key] < tol  # the single-GPU call itself (sanity of the bar)
