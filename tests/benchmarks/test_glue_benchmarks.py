"""The glue benchmarks on CPU: ``ab_vsa_glue.py`` (its configurations name real ``vsa_ops``
settings with values of the right kind, its CLI parses, it refuses to run without a GPU) and the
options added to ``bench_glue.py`` / ``bench_vsa_e2e.py`` (``--timer``, ``--coarse-overlap``,
``--compress-config``). Nothing is timed here; the GPU runs are in benchmarks/results/."""

import subprocess
import sys
from pathlib import Path

import pytest

from fastvideo_cute import vsa_ops
from fastvideo_cute.kernels.triton.vsa_coarse_fwd2 import resolve_fwd2_tiles

ROOT = Path(__file__).resolve().parents[2]


from .conftest import load_benchmark as _load


@pytest.fixture(scope="module")
def ab():
    return _load("ab_vsa_glue")


def test_ab_configs_set_existing_vsa_ops_settings(ab):
    assert ab.CONFIGS["default"] == {}
    for name, cfg in ab.CONFIGS.items():
        for attr, value in cfg.items():
            if attr == "backends.sm90_backend._FWD_VARIANT":  # a kernel configuration it accepts
                from fastvideo_cute.kernels.cute.block_sparse_fwd64 import sm90_kernel_class

                sm90_kernel_class()("bfloat16", 128, **value)
                continue
            if "." in attr:  # "module.attr" under fastvideo_cute
                import importlib

                mod, _, leaf = attr.rpartition(".")
                module = importlib.import_module("fastvideo_cute." + mod)
                assert hasattr(module, leaf), (name, attr)
                if leaf == "_KV_SPLITS":  # "auto" by default, an int >= 1 when forced
                    assert value == "auto" or (isinstance(value, int) and value >= 1), (name, value)
                else:
                    assert isinstance(value, type(getattr(module, leaf))), (name, attr)
                continue
            assert hasattr(vsa_ops, attr), (name, attr)
            if attr == "_COARSE_PHASE_TILES":
                resolve_fwd2_tiles(value, 128)  # raises on a tile the kernel does not take
            elif attr == "_COARSE_VARIANT":
                assert value in ("onepass", "twophase")
            elif attr == "_COARSE_BWD_TILES":  # None (the kernel's defaults) or per-phase tiles it takes
                from fastvideo_cute.kernels.triton.vsa_coarse_bwd import _phase_config

                for phase in ("a", "b"):
                    _phase_config(value, phase, 128)
            elif attr == "_COARSE_BWD_GRAD_PRECISION":
                from fastvideo_cute.kernels.triton.vsa_select import COARSE_PRECISIONS

                assert value is None or value in COARSE_PRECISIONS, (name, value)
            else:
                assert isinstance(value, type(getattr(vsa_ops, attr))), (name, attr)


def test_ab_configured_sets_and_restores(ab):
    before = (vsa_ops._COARSE_OVERLAP, vsa_ops._COARSE_VARIANT)
    with ab.configured("no-overlap"):
        assert vsa_ops._COARSE_OVERLAP is False and vsa_ops._COARSE_VARIANT == before[1]
    with pytest.raises(RuntimeError):
        with ab.configured("onepass"):
            assert vsa_ops._COARSE_VARIANT == "onepass"
            raise RuntimeError("a failing timing")
    assert (vsa_ops._COARSE_OVERLAP, vsa_ops._COARSE_VARIANT) == before
    with ab.configured("fastvideo"):  # not a configuration: nothing changes
        assert (vsa_ops._COARSE_OVERLAP, vsa_ops._COARSE_VARIANT) == before
    from fastvideo_cute.backends import sm90_backend

    assert sm90_backend._FWD_VARIANT is None
    with ab.configured("sm90-q64"):  # a dotted key: that module's setting
        assert sm90_backend._FWD_VARIANT == {"q_regs": 64}
    assert sm90_backend._FWD_VARIANT is None


def test_ab_parse_and_refuses_without_a_gpu(ab):
    args = ab.parse_args(["--sparsity", "0.875", "0.9", "--configs", "default", "onepass", "--mode", "fwdbwd"])
    assert args.sparsity == [0.875, 0.9] and args.configs == ["default", "onepass"] and args.mode == "fwdbwd"
    with pytest.raises(SystemExit):
        ab.parse_args(["--configs", "nonexistent"])
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="CUDA"):
            ab.main(["--configs", "default", "--no-fastvideo"])


def test_bench_glue_timer_option():
    glue = _load("bench_glue")
    assert glue.parse_args([]).timer == "do_bench"
    assert glue.parse_args(["--timer", "kernels", "--iters", "5"]).iters == 5
    with pytest.raises(SystemExit):
        glue.parse_args(["--timer", "wall"])


def test_e2e_glue_options_in_help():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_vsa_e2e.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--coarse-overlap", "--compress-config", "--coarse-variant"):
        assert flag in out.stdout


def _row(entry, ms, status="ok"):
    return {"entry": entry, "preset": "p", "tile": [4, 4, 4], "sparsity": 0.875, "mode": "fwd", "status": status,
            "ms": ms, "reason": None if status == "ok" else "boom"}


def test_e2e_rounds_take_the_median_and_keep_every_round():
    e2e = _load("bench_vsa_e2e")
    assert e2e.parse_args([]).rounds == 1 and e2e.parse_args(["--rounds", "3"]).rounds == 3
    ours = e2e.merge_rounds([_row("ours", 2.0), _row("ours", 1.0), _row("ours", 4.0)])
    fv = e2e.merge_rounds([_row("fastvideo", 3.0), _row("fastvideo", 2.6), _row("fastvideo", 4.4)])
    assert ours["ms"] == 2.0 and ours["ms_rounds"] == [2.0, 1.0, 4.0]
    e2e.add_speedups([ours, fv])
    assert ours["speedup_vs_fastvideo"] == 3.0 / 2.0
    assert ours["speedup_vs_fastvideo_rounds"] == [1.5, 2.6, 1.1]
    # one round: the row itself (no per-round lists); a failed round: the failure
    single = _row("ours", 2.0)
    assert e2e.merge_rounds([single]) is single and "ms_rounds" not in single
    bad = _row("ours", None, status="error")
    assert e2e.merge_rounds([_row("ours", 2.0), bad])["status"] == "error"


def test_ab_padding_probe_cli_and_the_switch_it_patches():
    """``ab_padding_probe.py`` parses, and the ops function it patches to turn the probe off exists
    (a renamed one would leave both arms probing)."""
    from fastvideo_cute import ops

    assert callable(ops._probe_padding)
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab_padding_probe.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--grid", "--tile", "--rounds", "--out"):
        assert flag in out.stdout
