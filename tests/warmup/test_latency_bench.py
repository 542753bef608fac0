"""benchmarks/warmup_latency.py's bookkeeping (its GPU part runs on the device)."""

import importlib.util
import subprocess
import sys

import pytest
import torch


from ._helpers import ROOT


# ---------------------------------------------------------------------------------------------- benchmark script


def _bench():
    path = ROOT / "benchmarks" / "warmup_latency.py"
    spec = importlib.util.spec_from_file_location("warmup_latency_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmark_args_and_combine():
    bench = _bench()
    args, rest = bench.parse_args([])
    assert rest == bench.DEFAULT_WARMUP_ARGS and args.target == 0.3
    args, rest = bench.parse_args(["--target", "0.2", "--preset", "wan2.1-14b-720p", "--route", "cute"])
    assert args.target == 0.2 and rest == ["--preset", "wan2.1-14b-720p", "--route", "cute"]
    cold = {"report": {"rows": [{"id": "a", "first_s": 3.2, "cache": "miss"}]}}
    warm = {"report": {"rows": [{"id": "a", "first_s": 0.25, "steady_s": 0.05, "cache": "hit", "variant": "v"},
                                {"id": "b", "first_s": 0.9, "steady_s": 0.1, "cache": "hit"}]}}
    rows = bench.combine(cold, warm, 0.3)
    assert rows[0]["cold_first_s"] == 3.2 and rows[0]["target_ok"] is True
    assert abs(rows[0]["warm_overhead_s"] - 0.2) < 1e-9 and abs(rows[0]["cold_overhead_s"] - 3.15) < 1e-9
    assert rows[1]["target_ok"] is False and rows[1]["cold_first_s"] is None
    assert "NO" in bench.format_rows(rows, 0.3)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_benchmark_refuses_cpu():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "warmup_latency.py")], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "needs a CUDA GPU" in out.stderr
