"""Shared by the benchmark scripts' CPU tests: a script of benchmarks/ loaded as a module."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a fresh module (``<name>_under_test``); the benchmarks folder goes
    on ``sys.path`` first, as when the script runs, so its own imports of sibling scripts resolve."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def load_script():
    """:func:`load_benchmark` as a fixture."""
    return load_benchmark
