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


def test_l2_hints_put_their_policies_on_the_k_and_ds_loads():
    """``ds_evict_first`` / ``k_evict_last``: the dS bulk copy carries the evict_first policy (0x12f00000 in its
    descriptor register), K's TMA loads evict_last (0x14f00000); registers and the wgmma group unchanged."""
    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import CuteKernelSpec
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_dq_from_ds_kernel

    reports = {}
    for cfg in ({}, {"ds_evict_first": True, "k_evict_last": True}):
        spec = CuteKernelSpec(name="block_sparse_dq64_sm90", archs=("sm_90a",),
                              make=lambda cfg=cfg: sm90_dq_from_ds_kernel(**cfg), expect=("HGMMA", "UTMALDG", "UBLKCP"))
        reports[bool(cfg)] = build_report(spec, "sm_90a")
    plain, hinted = reports[False], reports[True]
    print(hinted.line)
    assert hinted.ok and hinted.spill == 0 and hinted.regs == plain.regs, (hinted.line, plain.line)
    assert re.findall(r"HGMMA\.(\d+x\d+x\d+)\.F32\.BF16 R\d+, gdesc", hinted.sass) == ["64x128x16"] * 4
    assert len(re.findall(r"UBLKCP\.S\.G [^;]*desc\[UR\d+\]", hinted.sass)) == 1
    assert re.findall(r"UTMALDG[^;]*desc\[URZ\]", hinted.sass) == []  # every K load with a policy
    low = hinted.sass.lower()
    assert "0x12f00000" in low and "0x14f00000" in low
    assert "0x12f00000" not in plain.sass.lower() and re.findall(r"UBLKCP[^;]*desc", plain.sass) == []
    assert sm90_dq_from_ds_kernel().config() == {"stages": 4, "ctas_per_sm": 2}  # the default's compile key


@pytest.mark.parametrize("bad, match", [(dict(stages=1), "stages"), (dict(ctas_per_sm=4), "ctas_per_sm"),
                                        (dict(stages=4, ctas_per_sm=3), "shared memory")])
def test_bad_configuration_is_refused(bad, match):
    from fastvideo_cute.kernels.cute.block_sparse_bwd64 import sm90_dq_from_ds_kernel

    with pytest.raises(ValueError, match=match):
        sm90_dq_from_ds_kernel(**bad)
