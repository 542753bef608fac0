"""CPU checks of the CuTe DSL mma.sync + TMA block-sparse forward (128-token blocks).

Cross-compiles both modes (``w4r3``, ``simple_split``) for the kernel's three targets (sm_121a:
the GB10, sm_120a, sm_90a) through the shared session fixture (``conftest.kernel_report``: one
compile per (mode, arch), the library's own compile path) and checks the SASS: mma.sync
(HMMA.16816) and TMA loads (UTMALDG), no wgmma (HGMMA) nor tcgen05 (UTCHMMA), spills within the
measured budget. Also: the modes' static configuration, the shared-memory budget, the arch
tables and the adapter's per-arch default. About 30 s on a 2-core box.
"""

import dataclasses

import pytest
import torch

from fastvideo_cute.compile_check import build_report, sass_is_for_arch
from fastvideo_cute.kernels.cute import REGISTRY, find
from fastvideo_cute.kernels.cute import block_sparse_fwd128 as pkg

pytest.importorskip("cutlass")

TARGETS = ("sm_121a", "sm_120a", "sm_90a")
NAMES = tuple(pkg.registry_name(mode) for mode in pkg.MODES)


@pytest.mark.parametrize("arch", TARGETS)
@pytest.mark.parametrize("name", NAMES)
def test_compile_check_passes_for_every_target(kernel_report, name, arch):
    report = kernel_report(name, arch)
    assert report.ok and report.line.endswith(" OK"), report.line
    assert report.spill is not None and report.spill <= find(name).max_spill_bytes, \
        f"the kernel spills more than measured on {arch}: {report.line}"


@pytest.mark.parametrize("arch", TARGETS)
@pytest.mark.parametrize("name", NAMES)
def test_sass_uses_mma_sync_and_tma(kernel_report, name, arch):
    sass = kernel_report(name, arch).sass
    assert sass_is_for_arch(sass, arch)
    assert "HMMA.16816.F32.BF16" in sass
    assert "UTMALDG" in sass
    assert "HGMMA" not in sass and "UTCHMMA" not in sass


def test_not_targeted_arch_is_skipped():
    for name in NAMES:
        report = build_report(find(name), "sm_100a")
        assert report.ok and "skipped (not targeted" in report.line


def test_compile_check_fails_on_missing_instruction(kernel_report):
    """A kernel whose SASS lacks an expected instruction fails the check (the session's compile
    is reused: same kernel, same key)."""
    kernel_report(NAMES[1], "sm_121a")
    spec = dataclasses.replace(find(NAMES[1]), expect=("HGMMA",))
    report = build_report(spec, "sm_121a")
    assert not report.ok and "lacks HGMMA" in report.line, report.line


def test_modes_configure_one_kernel():
    """The two modes are one class: 4 MMA warps issuing their own loads (128 threads) or 8 MMA
    warps and a producer warp (288); the mode is the static configuration (the cache key)."""
    w4r3, split = pkg.kernel("w4r3"), pkg.kernel("simple_split")
    assert type(w4r3) is type(split) is pkg.kernel_class()
    assert (w4r3.num_threads, w4r3.inline_producer) == (128, True)
    assert (split.num_threads, split.inline_producer) == (288, False)
    assert w4r3.config() == {"mode": "w4r3"} and split.config() == {"mode": "simple_split"}
    assert w4r3.cache_key("sm_90a") != split.cache_key("sm_90a")
    assert pkg.kernel("w4r3").cache_key("sm_90a") == w4r3.cache_key("sm_90a")
    with pytest.raises(ValueError):
        pkg.kernel("w4i")  # a removed variant


def test_shared_memory_fits_the_gb10():
    from fastvideo_cute.kernels.cute.block_sparse_fwd128.limits import SMEM_CAPACITY

    # Q 32 KB + K/V rings 2 x 2 x 16 KB + the barriers' allowance
    assert pkg.kernel_class().smem_bytes() == 96 * 1024 + 1024 <= SMEM_CAPACITY


def test_arch_tables_are_the_kernels():
    from fastvideo_cute.adapters import cute_sm120
    from fastvideo_cute.kernels.cute.block_sparse_fwd128.limits import CAPABILITIES

    assert cute_sm120.SUPPORTED_CAPABILITIES is CAPABILITIES
    assert set(pkg.TARGET_ARCHS) == set(CAPABILITIES.values()) == set(TARGETS)
    assert cute_sm120.VARIANTS == pkg.MODES == ("w4r3", "simple_split")
    assert set(NAMES) == {spec.name for spec in REGISTRY if spec.name.startswith("block_sparse_fwd128")}
    for name in NAMES:
        assert find(name).archs == TARGETS


def test_support_predicate_on_cpu_tensors():
    from fastvideo_cute.adapters import cute_sm120

    q = torch.zeros((1, 2, 256, 128), dtype=torch.bfloat16)
    idx = torch.zeros((1, 2, 2, 2), dtype=torch.int32)
    num = torch.zeros((1, 2, 2), dtype=torch.int32)
    vbs = torch.full((2,), 128, dtype=torch.int32)
    ok, reason = cute_sm120.sm120_fwd_support(q, q, q, idx, num, vbs)
    assert not ok and "CUDA" in reason
    with pytest.raises(ValueError, match="CUDA"):
        cute_sm120.sm120_block_sparse_fwd(q, q, q, idx, num, vbs)


def test_default_variant_per_arch(monkeypatch):
    """The measured choice per arch (w4r3 on the H200; simple_split on the GB10's one-CTA-per-SM
    budget), the environment overriding it, and a bad (or removed) name refused."""
    from fastvideo_cute.adapters import cute_sm120

    monkeypatch.delenv("FASTVIDEO_CUTE_SM120_KERNEL", raising=False)
    assert cute_sm120.default_variant("sm_90a") == "w4r3"
    assert cute_sm120.default_variant("sm_121a") == "simple_split"
    assert cute_sm120.default_variant("sm_120a") == "simple_split"
    assert cute_sm120.default_variant() == "simple_split"
    monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", "w4r3")
    assert cute_sm120.default_variant("sm_121a") == "w4r3"
    for bad in ("nope", "w4", "simple"):
        monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", bad)
        with pytest.raises(ValueError, match="FASTVIDEO_CUTE_SM120_KERNEL"):
            cute_sm120.default_variant("sm_90a")
