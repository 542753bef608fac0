"""Ulysses sequence parallelism on CPU: gloo, 2 and 4 spawned ranks, Triton interpreter, fp32.

One spawn per world size (module fixture) runs every case on every rank; this process computes
the single-process call on the whole sequence once per case and compares the ranks' slices with
it BIT FOR BIT: output, LSE and every gradient. Bitwise is the right bar here: the Triton route
is deterministic (every output element is written by one program, no atomics) and the math per
head is the same whether a call holds all heads or a subset (VSA's compression branch and top-k
are per head; the Triton programs are per (batch, head, q tile)), and the all-to-all only moves
bytes. One case is also checked against the fp32 torch reference (``fastvideo_cute.reference``).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.distributed._cases import CPU_CASES, CPU_PLAN, build, grad_names, result_seq_dim, run_single
from tests.distributed._launch import launch

pytestmark = [
    pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                       reason="needs torch.distributed with gloo"),
    # This process computes the single-process call on CPU tensors, which needs the interpreter
    # (switched on by tests/conftest.py only without CUDA). On a GPU box the NCCL tests cover it.
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                       reason="CPU parity runs under TRITON_INTERPRET=1 (CI); on GPUs see test_gpu_ulysses_nccl.py"),
]

_SINGLE: dict = {}


def _single(name):
    if name not in _SINGLE:
        case = CPU_CASES[name]
        _SINGLE[name] = run_single(case, build(case, "cpu"))
    return _SINGLE[name]


WORLDS = sorted(CPU_PLAN)
PAIRS = [(w, n) for w in WORLDS for n in CPU_PLAN[w]]


_SUITES: dict = {}


@pytest.fixture
def suite(request, tmp_path_factory):
    """One spawn per world size (``request.param``), cached for every test of that size whatever
    order pytest runs them in."""
    world = request.param
    if world not in _SUITES:
        _SUITES[world] = launch(world, "gloo", "gloo_suite", (), tmp_path_factory.mktemp(f"gloo{world}"))
    return world, _SUITES[world]


def _assemble(case, key, ranks):
    return torch.cat([r[key] for r in ranks], dim=result_seq_dim(case, key))


def _check_case(world, results, name):
    case = CPU_CASES[name]
    ranks = [res["cases"][name] for res in results]
    for r, res in enumerate(ranks):
        assert not isinstance(res, str), f"rank {r} of {world} failed {name}:\n{res}"
    single = _single(name)
    expected_keys = {"out"} | ({"lse"} if case.kind == "bs" else set()) | (
        {"d" + n for n in grad_names(case)} if case.grad else set())
    assert set(single) == expected_keys and set(ranks[0]) == expected_keys
    for key in sorted(expected_keys):
        got = _assemble(case, key, ranks)
        want = single[key]
        assert got.shape == want.shape, (key, got.shape, want.shape)
        diff = (got - want).abs().nan_to_num(0).max().item()
        assert torch.equal(got, want), f"{name} at world {world}: {key} differs (max |diff| {diff:.3e})"
    return ranks


@pytest.mark.parametrize("suite,name", PAIRS, indirect=["suite"], ids=[f"{w}ranks-{n}" for w, n in PAIRS])
def test_parity_with_single_process(suite, name):
    world, results = suite
    _check_case(world, results, name)


@pytest.mark.parametrize("suite", WORLDS, indirect=True, ids=lambda w: f"{w}ranks")
def test_gated_vsa_matches_fp32_reference(suite):
    """The assembled output against the independent fp32 torch reference. Tolerance: the one
    tests/test_api.py uses for fp32 on the Triton interpreter (1e-4; 10x for gradients)."""
    from fastvideo_cute.reference import video_sparse_attn_reference

    world, results = suite
    name = "vsa_bhsd_gate"
    case = CPU_CASES[name]
    t = build(case, "cpu")
    leaves = [t[n].clone().requires_grad_(True) for n in grad_names(case)]
    ref = video_sparse_attn_reference(*leaves[:3], t["sizes"], t["q_sizes"], case.topk, case.block, leaves[3])
    ref_grads = torch.autograd.grad(ref, leaves, t["dout"])
    ranks = [res["cases"][name] for res in results]
    assert not any(isinstance(r, str) for r in ranks)
    torch.testing.assert_close(_assemble(case, "out", ranks), ref.detach(), atol=1e-4, rtol=1e-4)
    for n, g in zip(grad_names(case), ref_grads):
        torch.testing.assert_close(_assemble(case, "d" + n, ranks), g, atol=1e-3, rtol=1e-3, msg=f"d{n}")


@pytest.mark.parametrize("suite", WORLDS, indirect=True, ids=lambda w: f"{w}ranks")
def test_bad_arguments_raise_before_any_collective(suite):
    """Every rank raises the same clear error; the cases that ran afterwards on the same group
    passed, so no rank had issued a collective the others did not."""
    world, results = suite
    expected = {
        "heads": ("ValueError", f"heads (3) must be divisible by the sequence-parallel group size ({world})"),
        "slice": ("ValueError", "positive whole number of 64-token tiles"),
        "local_sizes": ("ValueError", "variable_block_sizes must be the GLOBAL per-tile sizes"),
        "q_local_sizes": ("ValueError", "q_variable_block_sizes must be the GLOBAL per-tile sizes"),
        "layout": ("ValueError", "layout must be 'bhsd' or 'bshd'"),
        "gate_dtype": ("TypeError", "compress_attn_weight must have q's dtype"),
        "head_chunks": ("ValueError", "head_chunks must be an int in [1, heads per rank"),
        "map_heads": ("ValueError", "block_map must cover the whole sequence"),
        "map_local_seq": ("ValueError", "block_map must cover the whole sequence"),
        "map_dtype": ("TypeError", "block_map must be a bool tensor"),
    }
    for rank, res in enumerate(results):
        errors = res["errors"]
        assert set(errors) == set(expected)
        for key, (typ, text) in expected.items():
            assert errors[key] is not None, f"rank {rank}: {key} raised nothing"
            assert errors[key][0] == typ and text in errors[key][1], (rank, key, errors[key])
    assert results[0]["errors"]["local_sizes"][1].endswith("(it looks like this rank's slice: pass the global vector)")
    _check_case(world, results, CPU_PLAN[world][0])


@pytest.mark.parametrize("suite", WORLDS, indirect=True, ids=lambda w: f"{w}ranks")
def test_group_of_one_is_a_pass_through(suite):
    world, results = suite
    for rank, res in enumerate(results):
        assert res["passthrough"]["size"] == 1
    assert results[0]["passthrough"]["equal"] is True
