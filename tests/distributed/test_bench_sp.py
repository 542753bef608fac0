"""benchmarks/bench_sp.py on CPU without running a benchmark: arguments, world sizes, the
efficiency arithmetic, the chart writer on synthetic rows. (A CPU smoke run of the whole script:
``torchrun --nproc_per_node=2 --master_port=29751 benchmarks/bench_sp.py --smoke --out /tmp/sp.json``.)"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_sp.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_sp_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_runs():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--preset", "--world-sizes", "--head-chunks", "--weak-heads", "--modes", "--plot", "--replot"):
        assert flag in out.stdout


def test_defaults_are_wan14b_720p_64_tiles_87_5(bench):
    args = bench.build_parser().parse_args([])
    assert (args.preset, args.block, args.sparsity, args.dtype) == ("wan2.1-14b-720p", 64, 0.875, "bf16")
    from fastvideo_cute.warmup_presets import get_preset

    p = get_preset(args.preset)
    assert (p.heads, p.head_dim, p.latent_grid) == (40, 128, (21, 45, 80))
    assert p.seq_len(64) == 92160 and p.num_blocks(64) == 1440


def test_world_sizes_divide_the_heads(bench):
    assert bench.world_sizes(None, 8, 40) == [1, 2, 4, 5, 8]
    assert bench.world_sizes(None, 1, 40) == [1]
    assert bench.world_sizes([4, 2, 2], 8, 40) == [2, 4]
    with pytest.raises(SystemExit, match="divide 40 heads"):
        bench.world_sizes([3], 8, 40)
    with pytest.raises(SystemExit):
        bench.world_sizes([16], 8, 40)


def _row(scaling, n, mode, ms, chunks=1):
    return {"kind": "layer", "scaling": scaling, "n": n, "mode": mode, "ms": ms, "attn_ms": ms * 0.9,
            "head_chunks": chunks}


def test_efficiencies(bench):
    rows = [_row("strong", 1, "fwd", 100.0), _row("strong", 2, "fwd", 55.0), _row("strong", 8, "fwd", 15.625),
            _row("strong", 2, "fwd", 52.0, chunks=2), _row("weak", 1, "fwd", 20.0), _row("weak", 4, "fwd", 25.0),
            {"kind": "overhead", "n": 1}]
    bench.add_efficiencies(rows)
    assert rows[0]["efficiency"] == pytest.approx(1.0)
    assert rows[1]["efficiency"] == pytest.approx(100.0 / (2 * 55.0))
    assert rows[2]["efficiency"] == pytest.approx(0.8)
    assert rows[3]["efficiency"] == pytest.approx(100.0 / (2 * 52.0))  # chunked rows compare with n=1
    assert rows[5]["efficiency"] == pytest.approx(0.8)
    assert "efficiency" not in rows[6]


def test_replot_without_matplotlib_or_with_it(bench, tmp_path):
    rows = [_row("strong", 1, "fwd", 100.0), _row("strong", 2, "fwd", 55.0)]
    bench.add_efficiencies(rows)
    payload = {"args": {"preset": "x"}, "environment": {}, "results": rows}
    src = tmp_path / "r.json"
    src.write_text(json.dumps(payload))
    png = tmp_path / "r.png"
    assert bench.main(["--replot", str(src), "--plot", str(png)]) == 0
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    assert png.exists() == has_mpl
