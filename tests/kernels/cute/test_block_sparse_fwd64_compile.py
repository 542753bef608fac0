"""CPU checks of the CuTe DSL tcgen05 block-sparse forward (64-token blocks, sm_100a).

Cross-compiles the kernel with ``python -m fastvideo_cute.compile_check`` in a subprocess (the
CuTe DSL reads its artifact settings at import) for sm_100a and sm_103a, and checks the SASS:
tcgen05 MMA (UTCHMMA), tensor-memory loads (LDTM), TMA loads (UTMALDG), no mma.sync/wgmma; it
prints registers and spills. sm_90a is not targeted (tcgen05 does not exist there). A few
seconds on a 2-core box. Whether the kernel is *correct* is only known on a compute-capability
10.x GPU: tests/kernels/cute/test_block_sparse_fwd64_gpu.py.
"""

import os
import re
import subprocess
import sys

import pytest

from fastvideo_cute.compile_check import sass_is_for_arch

pytest.importorskip("cutlass")

NAME = "block_sparse_fwd64_sm100"
NAMES = (NAME, "block_sparse_fwd64_sm100_overlap")
TARGETS = ("sm_100a", "sm_103a")


def _run(args, **kw):
    env = dict(os.environ)
    env.pop("CUTE_DSL_ARCH", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, **kw)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    keep = tmp_path_factory.mktemp("cute_sass_fwd64")
    arch_args = [a for arch in (*TARGETS, "sm_90a") for a in ("--arch", arch)]
    kernel_args = [a for name in NAMES for a in ("--kernel", name)]
    proc = _run(["-m", "fastvideo_cute.compile_check", *arch_args, *kernel_args, "--keep", str(keep)])
    print(proc.stdout)  # the regs/spill report (pytest -s shows it)
    return proc, keep


@pytest.mark.parametrize("name", NAMES)
def test_compile_check_passes(compiled, name):
    proc, _ = compiled
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.split() and line.split()[0] == name]
    assert len(lines) == 3, proc.stdout
    for arch in TARGETS:
        (line,) = [line for line in lines if line.split()[1] == arch]
        assert line.endswith(" OK"), line
        regs = int(re.search(r"regs=(\d+)", line).group(1))
        spill = int(re.search(r"spill=(\d+)B", line).group(1))
        assert regs <= 255
        # Measured at 8 bytes of stack (255 registers) with nvidia-cutlass-dsl 4.8.1; a large
        # jump means the softmax/accumulator registers stopped fitting.
        assert spill <= 64, f"the kernel spills {spill} bytes on {arch}: {line}"
    (line,) = [line for line in lines if line.split()[1] == "sm_90a"]
    assert "skipped (not targeted" in line


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("arch", TARGETS)
def test_sass_uses_tcgen05_tmem_and_tma(compiled, arch, name):
    _, keep = compiled
    sass = (keep / f"{name}.{arch}.sass").read_text()
    assert sass_is_for_arch(sass, arch)
    ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
    count = lambda prefix: sum(1 for op in ops if op == prefix or op.startswith(prefix + "."))  # noqa: E731
    # S = Q K^T: 128/16 = 8 MMAs; O_j = P V: 64/16 = 4 MMAs (overlap: a second QK call site).
    assert count("UTCHMMA") == (12 if name == NAME else 20)
    assert count("LDTM") >= 2  # the S row and the O_j row
    assert count("UTMALDG") >= 3  # Q, K, V
    assert count("UTCBAR") >= 2  # tcgen05.commit to the S and O barriers
    assert count("HMMA") == 0 and count("HGMMA") == 0


def test_launch_limits_mirrored():
    """The adapter's support predicate mirrors the kernel module's launch limits."""
    pytest.importorskip("torch")
    from fastvideo_cute.adapters import cute_sm100_fwd as adapter
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import block_sparse_fwd64_sm100 as kmod

    assert adapter.BLOCK == kmod.BLOCK and adapter.HEAD_DIM == kmod.HEAD_DIM
    assert adapter.MAX_BATCH_HEADS == kmod.MAX_BATCH_HEADS
    assert adapter.MAX_ROWS == kmod.MAX_ROWS
    assert adapter.MAX_INDEX_ELEMS == kmod.MAX_INDEX_ELEMS


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


def test_softmax_math_builds_for_sm90a_and_sm100a():
    """The kernel's masking/softmax/LSE code (softmax_math.py) is arch-independent: its probe
    kernel compiles for sm_90a (where tests/kernels/cute/test_block_sparse_fwd64_gpu.py runs it
    on an H200) as well as sm_100a."""
    script = (
        "from fastvideo_cute.kernels.cute.block_sparse_fwd64.softmax_math import SoftmaxRowProbe\n"
        "for arch in ('sm_90a', 'sm_100a'):\n"
        "    SoftmaxRowProbe().compile(arch, tvm_ffi=False)\n"
        "    print(arch, 'OK')\n"
    )
    proc = _run(["-c", script])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sm_90a OK" in proc.stdout and "sm_100a OK" in proc.stdout


def test_registry_name_and_warmup_cache(tmp_path):
    """The adapter's registry name exists, and the kernel goes through the warm-up's disk cache
    (compile once, then load) on the CPU box."""
    script = (
        "import os\n"
        f"os.environ['FASTVIDEO_CUTE_CACHE_DIR'] = {str(tmp_path)!r}\n"
        "from fastvideo_cute.adapters import cute_sm100_fwd as a\n"
        "from fastvideo_cute.kernels.cute import find\n"
        "from fastvideo_cute.warmup import compile_registry_kernel\n"
        "assert find(a.REGISTRY_NAME).archs[0] == 'sm_100a'\n"
        "assert all(find(n).archs[0] == 'sm_100a' for n in a.REGISTRY_NAMES.values())\n"
        "fn, how = compile_registry_kernel(a.REGISTRY_NAME, 'sm_100a')\n"
        "print('first', how)\n"
    )
    proc = _run(["-c", script])
    assert proc.returncode == 0, proc.stdout + proc.stderr
