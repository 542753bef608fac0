"""The kernel exploration drivers on CPU: ``explore_fwd64_sm90.py``'s variant grammar (every spec
it accepts builds a configuration ``BlockSparseFwd64Sm90`` takes; a bad one is refused) and its
per-round ratio helper. Nothing is timed here; the GPU runs are in benchmarks/results/."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def explore():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("explore_fwd64_under_test", ROOT / "benchmarks" / "explore_fwd64_sm90.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("spec, want", [
    ("base", {}),
    ("k2v3c2st", {"k_stages": 2, "v_stages": 3, "ctas_per_sm": 2, "stmatrix_epilogue": True}),
    ("q112", {"q_regs": 112}),
    ("q", {"q_regs": 128}),
    ("c2ql", {"ctas_per_sm": 2, "q_regs": 128, "lazy_rescale": True}),
    ("e", {"lazy_rescale": False}),
    ("q64e", {"q_regs": 64, "lazy_rescale": False}),
])
def test_variant_grammar(explore, spec, want):
    assert explore.parse_variant(spec) == want


def test_variants_are_kernel_configurations(explore):
    pytest.importorskip("cutlass")
    from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel_class

    for spec in ("base", "q112l", "c2q", "e", "k2c2"):
        sm90_kernel_class()("bfloat16", 128, **explore.parse_variant(spec))


@pytest.mark.parametrize("bad", ["x", "q112z", "kx"])
def test_bad_variant_is_refused(explore, bad):
    with pytest.raises((SystemExit, KeyError)):
        explore.parse_variant(bad)


def test_round_ratios_compare_within_each_round(explore):
    # cuDNN drifts from 1.0 to 2.0 ms; the entry is always 10 % faster in its own round
    all_ms = {"cudnn": [1.0, 1.5, 2.0], "ours": [0.9 / 0.99, 1.35 / 0.99, 1.8 / 0.99]}
    ratios = explore.round_ratios(all_ms, "cudnn")
    assert ratios["cudnn"] == 1.0
    assert ratios["ours"] == pytest.approx(1.1)
