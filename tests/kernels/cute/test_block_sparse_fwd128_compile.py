"""CPU checks of the CuTe DSL mma.sync + TMA block-sparse forward (128-token blocks).

Cross-compiles the kernel for its three targets (sm_121a: the GB10, sm_120a, sm_90a) with
``python -m fastvideo_cute.compile_check`` in a subprocess (the CuTe DSL reads its artifact
settings at import), and checks the SASS: mma.sync (HMMA.16816) and TMA loads (UTMALDG), no
wgmma (HGMMA) nor tcgen05 (UTCHMMA), for every variant. About a minute on a 2-core box.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from fastvideo_cute.compile_check import sass_is_for_arch
from fastvideo_cute.kernels.cute import REGISTRY, find
import torch

pytest.importorskip("cutlass")

TARGETS = ("sm_121a", "sm_120a", "sm_90a")
NAME = "block_sparse_fwd128_sm120"
# every variant (block_sparse_fwd128.VARIANTS), each under its registry name
NAMES = tuple(spec.name for spec in REGISTRY if spec.name.startswith(NAME))


def _run(args, **kw):
    env = dict(os.environ)
    env.pop("CUTE_DSL_ARCH", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, **kw)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    keep = tmp_path_factory.mktemp("cute_sass")
    arch_args = [a for arch in (*TARGETS, "sm_100a") for a in ("--arch", arch)]
    kernel_args = [a for name in NAMES for a in ("--kernel", name)]
    proc = _run(["-m", "fastvideo_cute.compile_check", *arch_args, *kernel_args, "--keep", str(keep)])
    return proc, keep


@pytest.mark.parametrize("name", NAMES)
def test_compile_check_passes_for_every_target(compiled, name):
    proc, _ = compiled
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.split()[0] == name]
    assert len(lines) == 4, proc.stdout
    for arch in TARGETS:
        (line,) = [line for line in lines if line.split()[1] == arch]
        assert line.endswith(" OK"), line
        spill = int(line.split("spill=")[1].split("B")[0])
        assert spill <= find(name).max_spill_bytes, f"the kernel spills more than measured on {arch}: {line}"
    (line,) = [line for line in lines if line.split()[1] == "sm_100a"]
    assert "skipped (not targeted" in line


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arch", TARGETS)
def test_sass_uses_mma_sync_and_tma(compiled, arch, name):
    _, keep = compiled
    sass = (keep / f"{name}.{arch}.sass").read_text()
    assert sass_is_for_arch(sass, arch)
    assert "HMMA.16816.F32.BF16" in sass
    assert "UTMALDG" in sass
    assert "HGMMA" not in sass and "UTCHMMA" not in sass


def test_compile_check_fails_on_missing_instruction(tmp_path):
    """A variant whose SASS lacks an expected instruction makes the check fail."""
    script = textwrap.dedent(
        f"""
        import dataclasses, os
        os.environ.setdefault("CUTE_DSL_KEEP", "cubin")
        from fastvideo_cute import compile_check
        from fastvideo_cute.kernels.cute import find
        spec = dataclasses.replace(find("{NAME}"), expect=("HGMMA",))
        ok, line = compile_check.check_kernel(spec, "sm_121a")
        print(line)
        assert not ok and "lacks HGMMA" in line, line
        """
    )
    proc = _run(["-c", script])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_constructor_refuses_inconsistent_configs():
    """spread_producer spreads the inline producer's loads over the MMA warps and reads the walk
    exactly two chunks ahead: it needs the inline producer and two ring stages."""
    from fastvideo_cute.kernels.cute.block_sparse_fwd128.block_sparse_fwd128_sm120 import BlockSparseFwd128Sm120

    with pytest.raises(AssertionError, match="inline producer"):
        BlockSparseFwd128Sm120(num_mma_warps=4, spread_producer=True)
    with pytest.raises(AssertionError, match="two chunks ahead"):
        BlockSparseFwd128Sm120(num_mma_warps=4, inline_producer=True, spread_producer=True, kv_stages=3)
    k = BlockSparseFwd128Sm120(num_mma_warps=4, inline_producer=True, spread_producer=True, split_full=True)
    assert (k.num_threads, k.spread_producer, k.split_full) == (128, True, True)


def test_arch_table_and_limits_agree():
    from fastvideo_cute.adapters import cute_sm120
    from fastvideo_cute.kernels.cute import block_sparse_fwd128 as pkg
    from fastvideo_cute.kernels.cute.block_sparse_fwd128 import block_sparse_fwd128_sm120 as mod

    assert pkg.variant_class("simple") is mod.BlockSparseFwd128Sm120
    assert pkg.variant_class("ws").__name__ == "BlockSparseFwd128Sm120WS"
    assert set(cute_sm120.VARIANTS) == set(pkg.VARIANTS)
    assert {pkg.registry_name(v) for v in pkg.VARIANTS} <= {spec.name for spec in REGISTRY}
    assert cute_sm120.default_variant() in cute_sm120.VARIANTS
    for family, arch in ((90, "sm_90a"), (120, "sm_120a"), (121, "sm_121a")):
        assert pkg.kernel_class(family) is mod.BlockSparseFwd128Sm120
        assert pkg.target_arch(family) == arch
        assert cute_sm120.SUPPORTED_CAPABILITIES[divmod(family, 10)] == arch
    assert 100 not in pkg.KERNEL_BY_ARCH
    assert cute_sm120.MAX_BATCH_HEADS == mod.MAX_BATCH_HEADS
    assert cute_sm120.MAX_ROWS == mod.MAX_ROWS
    assert cute_sm120.MAX_INDEX_ELEMS == mod.MAX_INDEX_ELEMS


def test_shared_memory_fits_the_gb10():
    from fastvideo_cute.kernels.cute.block_sparse_fwd128 import block_sparse_fwd128_sm120 as mod

    mod.BlockSparseFwd128Sm120()  # asserts its own budget
    with pytest.raises(AssertionError):
        mod.BlockSparseFwd128Sm120(kv_stages=3)


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
    assert cute_sm120.sm120_within_launch_limits(1, 65535, 256, 2, 2)
    assert not cute_sm120.sm120_within_launch_limits(1, 65536, 256, 2, 2)
    assert not cute_sm120.sm120_within_launch_limits(1, 1, 2**31, 2**24, 1)
    assert not cute_sm120.sm120_within_launch_limits(1, 1, 2**16 * 128, 2**16, 2**16)


def test_default_variant_per_arch(monkeypatch):
    """The measured choice per arch (w4r3 on the H200; simple_split on the GB10's one-CTA-per-SM
    budget), the environment overriding it, and a bad name refused."""
    from fastvideo_cute.adapters import cute_sm120

    monkeypatch.delenv("FASTVIDEO_CUTE_SM120_KERNEL", raising=False)
    assert cute_sm120.default_variant("sm_90a") == "w4r3"
    assert cute_sm120.default_variant("sm_121a") == "simple_split"
    assert cute_sm120.default_variant("sm_120a") == "simple_split"
    assert cute_sm120.default_variant() == "simple_split"
    monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", "w4")
    assert cute_sm120.default_variant("sm_90a") == "w4"
    monkeypatch.setenv("FASTVIDEO_CUTE_SM120_KERNEL", "nope")
    with pytest.raises(ValueError, match="FASTVIDEO_CUTE_SM120_KERNEL"):
        cute_sm120.default_variant("sm_90a")
