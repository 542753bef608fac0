"""Compiler output never lands in the working directory (issue 11, item 14).

The CuTe DSL writes its artifacts (``cutlass___call___*.cubin``, ``.ptx``...) into the working
directory unless told otherwise. The library's compile path (``fastvideo_cute.jit``) gives every
compile a dump directory (``$CUTE_DSL_DUMP_DIR`` or a temporary one), and importing
``fastvideo_cute.compile_check`` sets no ``CUTE_DSL_*`` variable. Checked three ways: the import
in a fresh process, ``python -m fastvideo_cute.compile_check`` from an empty temporary working
directory with ``CUTE_DSL_KEEP`` set (as a user's environment may have it), and this session's own
compile tests (the working directory and the repository root against their listing at collection).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
ARTIFACT_SUFFIXES = (".cubin", ".ptx", ".sass", ".mlir", ".o")


def _listing(directory: Path):
    return set(os.listdir(directory))


def _artifacts(names):
    return sorted(n for n in names if n.endswith(ARTIFACT_SUFFIXES) or n.startswith("cutlass_"))


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUTE_DSL_") and k != "FASTVIDEO_CUTE_CACHE_DIR"}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_importing_compile_check_sets_no_dsl_variable():
    code = ("import os, fastvideo_cute.compile_check, fastvideo_cute.jit; "
            "print(sorted(k for k in os.environ if k.startswith('CUTE_DSL_')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_compile_check_writes_nothing_in_the_working_directory(tmp_path):
    pytest.importorskip("cutlass")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    repo_before = _listing(REPO)
    cmd = [sys.executable, "-m", "fastvideo_cute.compile_check", "--arch", "sm_90a",
           "--kernel", "block_sparse_bwd64_postprocess"]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=_env(CUTE_DSL_KEEP="cubin,ptx"),
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert " OK" in out.stdout
    assert list(cwd.iterdir()) == []
    assert _artifacts(_listing(REPO) - repo_before) == []


def test_this_sessions_compiles_left_the_working_directory_untouched(kernel_report, workdir_before):
    """Runs after the other compile tests of this directory (file order); compiles at least once."""
    assert kernel_report("block_sparse_bwd64_postprocess", "sm_90a").ok
    for label, (directory, before) in workdir_before.items():
        new = _artifacts(_listing(Path(directory)) - before)
        assert new == [], f"compiler output appeared in the {label} ({directory}): {new}"
