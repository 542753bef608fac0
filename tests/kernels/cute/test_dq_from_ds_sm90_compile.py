"""CPU checks of the experimental split backward's q-owned dQ kernel (``block_sparse_bwd64/dq_from_ds_sm90``):
cross-compiled for sm_90a, its SASS holds dQ += dS K as one 64x128x16 wgmma group of four k-steps (both
operands from shared memory), K tiles by TMA and the stored dS tiles by one bulk copy a step, no spill,
registers within its CTAs per SM of 160 threads (the default build: two; the three-CTA build too). Correctness and speed on the H200:
tests/kernels/cute/test_block_sparse_bwd64_sm90_split_gpu.py, benchmarks/explore_ds_split.py."""

import re

import pytest

pytest.importorskip("cutlass")


@pytest.mark.parametrize("config", [{}, {"stages": 3, "ctas_per_sm": 3}], ids=["default", "s3c3"])
def test_dq_kernel_compiles_to_one_wgmma_group_fed_by_tma_and_a_bulk_copy(config):
    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_dq_from_ds_kernel

    spec = CuteKernelSpec(name="block_sparse_dq64_sm90", archs=("sm_90a",),
                          make=lambda: sm90_dq_from_ds_kernel(**config), expect=("HGMMA", "UTMALDG", "UBLKCP"))
    ctas = sm90_dq_from_ds_kernel(**config).ctas_per_sm
    report = build_report(spec, "sm_90a")
    print(report.line)
    assert report.ok and report.spill == 0 and report.regs <= 65536 // (160 * ctas), report.line
    assert re.findall(r"HGMMA\.(\d+x\d+x\d+)\.F32\.BF16 R\d+, gdesc", report.sass) == ["64x128x16"] * 4
    assert len(re.findall(r"UBLKCP\.S\.G ", report.sass)) == 1  # the dS tile, global -> shared
    assert report.count("UTMALDG") >= 1 and report.count("REDG") == 0


@pytest.mark.parametrize("bad, match", [(dict(stages=1), "stages"), (dict(ctas_per_sm=4), "ctas_per_sm"),
                                        (dict(stages=4, ctas_per_sm=3), "shared memory")])
def test_bad_configuration_is_refused(bad, match):
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_dq_from_ds_kernel

    with pytest.raises(ValueError, match=match):
        sm90_dq_from_ds_kernel(**bad)
