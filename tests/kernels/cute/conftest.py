"""Shared compile fixtures of the CuTe kernel tests.

``kernel_report(name, arch)`` compiles a registry kernel for an arch once per session, in this
process, through the library's one compile path (``fastvideo_cute.compile_check.build_report`` ->
``fastvideo_cute.jit.compile_kernel(..., need_cubin=True)``: compiler output goes to a temporary
directory) and returns its report (printed line, cubin, SASS, opcode counts, registers, spill),
shared by every test that asks for the same pair. ``probe_build(arch)`` does the same for the
64-token forward's softmax probe (not a registry kernel).

``workdir_before`` is the listing of the working directory and the repository root when these
tests were collected, for the test that nothing was written there (test_compile_artifacts.py).
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _listing(directory: Path):
    try:
        return set(os.listdir(directory))
    except OSError:
        return set()


WORKDIR_BEFORE = {"cwd": (Path.cwd(), _listing(Path.cwd())), "repo": (REPO, _listing(REPO))}

_REPORTS = {}


@pytest.fixture(scope="session")
def workdir_before():
    """{"cwd" | "repo": (directory, its entries when this conftest was imported)}."""
    return WORKDIR_BEFORE


@pytest.fixture(scope="session")
def kernel_report():
    pytest.importorskip("cutlass")
    from fastvideo_cute.compile_check import build_report
    from fastvideo_cute.kernels.cute import find

    def get(name: str, arch: str):
        if (name, arch) not in _REPORTS:
            _REPORTS[name, arch] = build_report(find(name), arch)
        return _REPORTS[name, arch]

    return get


@pytest.fixture(scope="session")
def probe_build():
    """arch -> the softmax probe compiled for it (``jit.compile_kernel``'s ``(compiled, how)``)."""
    pytest.importorskip("cutlass")
    from fastvideo_cute.jit import compile_kernel
    from fastvideo_cute.kernels.cute.block_sparse_fwd64.softmax_probe import SoftmaxRowProbe

    built = {}

    def get(arch: str):
        if arch not in built:
            built[arch] = compile_kernel(SoftmaxRowProbe(), arch, need_cubin=True)
        return built[arch]

    return get
