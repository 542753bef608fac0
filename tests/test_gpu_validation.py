"""On a GPU: a sizes tensor whose full block becomes partial between calls (NaN in the new
padding) is re-checked, so the FA4 route's padding pass runs and nothing leaks (issue #11 item 3);
a write the host record cannot see (through ``.data``) trips the documented device-side assert."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute.reference import block_sparse_attn_reference

pytestmark = pytest.mark.gpu
OUT_TOL = 1e-2  # bf16 route error vs the fp32 reference (tests/test_gpu_cute_route.py)


def _nerr(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-6)).item()


@pytest.mark.parametrize("route", ["cute", "triton"])
def test_full_block_turning_partial_between_calls(monkeypatch, route):
    if route == "cute":
        pytest.importorskip("flash_attn.cute")
        monkeypatch.setenv("FASTVIDEO_VSA_CUTEDSL", "1")
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 3 * 128, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    m = torch.ones(1, 2, 3, 3, dtype=torch.bool, device="cuda")
    sizes = torch.full((3,), 128, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        fvc.block_sparse_attn_128(q, k, v, m, sizes)  # recorded: every block full
        sizes[1] = 60  # in place: the version counter moves
        k[:, :, 128 + 60:256] = float("nan")
        v[:, :, 128 + 60:256] = float("inf")
        out, _ = fvc.block_sparse_attn_128(q, k, v, m, sizes)
    ref, _ = block_sparse_attn_reference(q, k, v, m, sizes, 128)
    assert torch.isfinite(out).all()
    assert _nerr(out, ref) < OUT_TOL


@pytest.mark.parametrize("value", [999, 5], ids=["out-of-range", "full-turned-partial"])
def test_write_through_data_trips_the_device_assert(tmp_path, value):
    """A write through ``.data`` (no version bump) that leaves [0, 128] or breaks the "every
    block full" record trips the backstop's device assert, whose message names the tensor."""
    script = textwrap.dedent(f"""
        import torch, fastvideo_cute as fvc
        q = k = v = torch.randn(1, 1, 256, 64, device="cuda", dtype=torch.bfloat16)
        m = torch.ones(1, 1, 2, 2, dtype=torch.bool, device="cuda")
        s = torch.full((2,), 128, dtype=torch.int32, device="cuda")
        fvc.block_sparse_attn_128(q, k, v, m, s)
        torch.cuda.synchronize()
        print("FIRST CALL OK", flush=True)
        s.data[1] = {value}   # no version bump: only the device-side backstop can see it
        fvc.block_sparse_attn_128(q, k, v, m, s)
        torch.cuda.synchronize()
        print("NOT CAUGHT")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "FASTVIDEO_VSA_TRITON": "1"})
    assert "FIRST CALL OK" in r.stdout, (r.stdout, r.stderr[-2000:])
    assert r.returncode != 0 and "NOT CAUGHT" not in r.stdout, (r.stdout, r.stderr[-2000:])
    assert "variable_block_sizes changed behind the library's back" in r.stderr, r.stderr[-2000:]
