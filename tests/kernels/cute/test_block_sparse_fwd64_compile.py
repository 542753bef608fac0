"""CPU checks of the CuTe DSL tcgen05 block-sparse forward (64-token blocks, sm_100a).

Cross-compiles the kernel for sm_100a and sm_103a through the shared session fixture
(``conftest.kernel_report``) and checks the SASS: tcgen05 MMA (UTCHMMA), tensor-memory loads
(LDTM), TMA loads (UTMALDG), no mma.sync/wgmma; registers and spills. sm_90a is not targeted
(tcgen05 does not exist there). The softmax probe (the shared softmax math) builds for sm_90a and
sm_100a. Whether the kernel is *correct* is only known on a compute-capability 10.x GPU:
tests/kernels/cute/test_block_sparse_fwd64_gpu.py.
"""

import pytest

from fastvideo_cute.compile_check import build_report, sass_is_for_arch
from fastvideo_cute.jit import cubin_of
from fastvideo_cute.kernels.cute import find

pytest.importorskip("cutlass")

NAME = "block_sparse_fwd64_sm100"
TARGETS = ("sm_100a", "sm_103a")


@pytest.mark.parametrize("arch", TARGETS)
def test_compile_check_passes(kernel_report, arch):
    report = kernel_report(NAME, arch)
    print(report.line)  # the regs/spill report (pytest -s shows it)
    assert report.ok and report.line.endswith(" OK"), report.line
    assert report.regs <= 255
    # Measured at 8 bytes of stack (255 registers) with nvidia-cutlass-dsl 4.8.1; a large jump
    # means the softmax/accumulator registers stopped fitting.
    assert report.spill <= 64, f"the kernel spills {report.spill} bytes on {arch}: {report.line}"


def test_sm90a_is_not_targeted():
    assert "skipped (not targeted" in build_report(find(NAME), "sm_90a").line


@pytest.mark.parametrize("arch", TARGETS)
def test_sass_uses_tcgen05_tmem_and_tma(kernel_report, arch):
    report = kernel_report(NAME, arch)
    assert sass_is_for_arch(report.sass, arch)
    # S = Q K^T: 128/16 = 8 MMAs; O_j = P V: 64/16 = 4 MMAs.
    assert report.count("UTCHMMA") == 12
    assert report.count("LDTM") >= 2  # the S row and the O_j row
    assert report.count("UTMALDG") >= 3  # Q, K, V
    assert report.count("UTCBAR") >= 2  # tcgen05.commit to the S and O barriers
    assert report.count("HMMA") == 0 and report.count("HGMMA") == 0


def test_support_refuses_without_sm100():
    """On the CPU box (or any non-10.x device) the predicate refuses with a reason, never raises."""
    import torch

    from fastvideo_cute.adapters import cute_sm100_fwd as adapter

    q = torch.zeros(1, 1, 64, 128, dtype=torch.bfloat16)
    idx = torch.zeros(1, 1, 1, 1, dtype=torch.int32)
    num = torch.ones(1, 1, 1, dtype=torch.int32)
    vbs = torch.full((1,), 64, dtype=torch.int32)
    ok, reason = adapter.sm100_fwd64_support(q, q, q, idx, num, vbs)
    if not torch.cuda.is_available():
        assert not ok and "CUDA" in reason
    with pytest.raises(ValueError):
        if not ok:
            adapter.sm100_block_sparse_fwd64(q, q, q, idx, num, vbs)
        else:
            raise ValueError("supported here; nothing to refuse")


@pytest.mark.parametrize("arch", ("sm_90a", "sm_100a"))
def test_softmax_math_builds_for_sm90a_and_sm100a(probe_build, arch):
    """The kernel's masking/softmax/LSE code (common/softmax.py) is arch-independent: its probe
    kernel compiles for sm_90a (where tests/kernels/cute/test_block_sparse_fwd64_gpu.py runs it
    on an H200) as well as sm_100a."""
    compiled, _ = probe_build(arch)
    assert cubin_of(compiled)


def test_registry_name_and_targets():
    from fastvideo_cute.adapters import cute_sm100_fwd as adapter

    assert find(adapter.REGISTRY_NAME).archs == TARGETS
    assert set(adapter.SUPPORTED_CAPABILITIES.values()) == set(TARGETS)
