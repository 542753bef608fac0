"""CPU checks of our Hopper 64-token backward main kernel (``block_sparse_bwd64_sm90``: wgmma + TMA).

Cross-compiles the kernel for sm_90a through the shared session fixture and checks its SASS: the
five GEMMs as wgmma (64x64x16 for S^T = K Q^T and dP^T = V dO^T, 8 k-steps each; 64x128x16 for
dV += P^T dO and dK += dS^T Q, 4 each; 64x64x16 for the two dQ halves, 4 each), TMA loads (K, V,
two Q / dO issue sites), bulk fp32 reductions for dq_accum (the default; the atomic
configuration: one REDG per element), no mma.sync or tcgen05; registers within the
two-CTAs-per-SM budget (65536 / 256 threads: 255 is ptxas's cap), no spill. Correctness is checked
on the H200: tests/kernels/cute/test_block_sparse_bwd64_sm90_gpu.py.
"""

import re

import pytest

from fastvideo_cute.compile_check import build_report, inflight_operand_writes, sass_is_for_arch
from fastvideo_cute.kernels.cute import find

pytest.importorskip("cutlass")

NAME = "block_sparse_bwd64_sm90"


def test_compile_check_passes(kernel_report):
    report = kernel_report(NAME, "sm_90a")
    print(report.line)
    assert report.ok and report.line.endswith(" OK"), report.line
    # Measured 252 registers with nvidia-cutlass-dsl 4.8.1 (two 128-thread CTAs: cap 255), no spill.
    assert report.regs <= 255, report.line
    assert report.spill == 0, report.line


def test_sass_uses_wgmma_tma_and_reductions(kernel_report):
    report = kernel_report(NAME, "sm_90a")
    assert sass_is_for_arch(report.sass, "sm_90a")
    shapes = re.findall(r"HGMMA\.(\d+x\d+x\d+)\.F32", report.sass)
    assert shapes.count("64x64x16") == 8 + 8 + 4 + 4, shapes  # S^T, dP^T, dQ halves
    assert shapes.count("64x128x16") == 4 + 4, shapes  # dV, dK
    assert report.count("UTMALDG") >= 4  # K, V, Q and dO (prologue and loop)
    # dq_accum by the TMA unit (two bulk reductions per step), no per-element atomics
    assert report.count("UBLKRED") >= 2 and report.count("REDG") == 0
    assert report.count("HMMA") == 0 and report.count("UTCHMMA") == 0


def test_other_archs_are_not_targeted():
    assert "skipped (not targeted" in build_report(find(NAME), "sm_100a").line


def test_atomic_variant_reduces_per_element(kernel_report):
    """``dq_reduce="atomic"``: one fp32 reduction per dQ element of the thread (64 x 128 / 128
    threads), the same wgmma, no spill (254 registers measured)."""
    report = kernel_report(NAME + "_atomic", "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0 and report.regs <= 255, report.line
    assert report.count("REDG.E.ADD.F32") == 64 and report.count("UBLKRED") == 0
    assert report.count("HGMMA") == 32


def test_smem_stats_variant_copies_lse_and_delta_in_bulk():
    """``stats_in_smem``: lse2/delta arrive by two 256-byte bulk copies per q block (two issue
    sites: the first block and the loop's prefetch) and are read from shared memory; no spill."""
    from functools import partial

    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_main_kernel

    spec = CuteKernelSpec(name=NAME + "_smemstats", archs=("sm_90a",), make=partial(sm90_main_kernel, "bulk", True),
                          expect=("HGMMA", "UTMALDG", "UBLKRED", "UBLKCP"))
    report = build_report(spec, "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0 and report.regs <= 255, report.line
    assert report.count("UBLKCP") == 4 and report.count("LDS") >= 8
    assert report.count("HGMMA") == 32


def test_bad_configuration_is_refused():
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_main_kernel

    with pytest.raises(ValueError, match="dq_reduce"):
        sm90_main_kernel("tma")


def test_flat_variant_stages_dq_in_register_order():
    """``dq_reduce="flat"``: dQ as one 64x128 wgmma group beside dK (12 HGMMA.64x128x16 with dV),
    dS written by stmatrix (4 STSM), dQ staged by 16 128-bit stores a thread and added by two bulk
    reductions, lse2/delta by bulk copy; the wgmmas pipelined (the three waits the step asks for, as
    measured with nvidia-cutlass-dsl 4.8.1: S^T, dP^T, the step's end), no spill (250 registers)."""
    from functools import partial

    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_main_kernel

    spec = CuteKernelSpec(name=NAME + "_flat", archs=("sm_90a",), make=partial(sm90_main_kernel, "flat"),
                          expect=("HGMMA", "UTMALDG", "UBLKRED", "UBLKCP", "STSM"))
    report = build_report(spec, "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0 and report.regs <= 255, report.line
    shapes = re.findall(r"HGMMA\.(\d+x\d+x\d+)\.F32", report.sass)
    assert shapes.count("64x64x16") == 8 + 8 and shapes.count("64x128x16") == 4 + 4 + 4, shapes
    assert report.count("UBLKRED") == 2 and report.count("REDG") == 0
    assert report.count("STSM") == 4 and report.count("STS.128") >= 16
    assert report.sass.count("WARPGROUP.DEPBAR") <= 4, report.line
    # dS^T is computed while dV += P^T dO (P^T from registers) may still run: nothing may land on
    # P^T's registers before that wgmma's wait
    assert inflight_operand_writes(report.sass) == [], report.line
