"""benchmarks/bench_vsa.py on CPU: argument parsing, FLOP accounting, JSON and chart writers
(synthetic timings; nothing is benchmarked here)."""

import os
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_vsa.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_vsa_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_help_runs_on_cpu():
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for flag in ("--seqlens", "--block-size", "--sparsity", "--routes", "--peers", "--modes", "--out", "--plot",
                 "--smoke"):
        assert flag in out.stdout


def test_parse_args(bench):
    a = bench.parse_args([])
    assert (a.batch, a.heads, a.head_dim) == (1, 12, 128)
    assert a.seqlens == [32768, 65536] and a.sparsity == [0.875]
    assert a.routes == ["triton", "cute"] and a.modes == ["fwd", "bwd"]
    assert set(a.peers) == {"sdpa-flash", "sdpa-cudnn", "flex", "fa4-dense", "fa4-bsparse"}
    a = bench.parse_args(["--block-size", "64", "256", "--sparsity", "0.5", "0.875", "--routes", "cute",
                          "--peers", "fa4-bsparse", "--modes", "fwd", "--out", "x.json", "--plot", "x.png"])
    assert a.block_size == [64, 256] and a.sparsity == [0.5, 0.875] and a.routes == ["cute"]
    assert a.peers == ["fa4-bsparse"] and a.modes == ["fwd"] and a.out == "x.json" and a.plot == "x.png"
    s = bench.parse_args(["--smoke"])
    assert s.seqlens == [2048] and s.heads <= 2 and s.rep <= 10 and s.name == "smoke"
    for bad in (["--seqlens", "1000", "--block-size", "128"], ["--sparsity", "1.0"], ["--block-size", "96"],
                ["--replot", "r.json"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_flops(bench):
    assert bench.topk_for(0.875, 512) == 64 and bench.topk_for(0.99, 8) == 1 and bench.topk_for(0.0, 8) == 8
    f = bench.case_flops(1, 12, 128, 512, 64, 128, "fwd")
    assert f == 4 * 1 * 12 * 128 * (512 * 64) * 128 * 128
    assert bench.case_flops(1, 12, 128, 512, 64, 128, "bwd") == 2.5 * f
    assert bench.dense_flops(1, 12, 128, 65536, 65536, "fwd") == 4 * 12 * 128 * 65536 ** 2
    assert bench.tflops(1e12, 1000.0) == pytest.approx(1.0)


def _synthetic_payload(bench):
    args = bench.parse_args(["--seqlens", "32768", "--block-size", "128", "256", "--sparsity", "0.5", "0.875"])
    runner = bench.Runner(args)
    timings = {"triton": 2.0, "cute": 1.0, "sdpa-flash": 8.0, "fa4-bsparse": 0.9}
    for block in (128, 256):
        for sparsity in (0.5, 0.875):
            n = 32768 // block
            topk = bench.topk_for(sparsity, n)
            case = types.SimpleNamespace(
                seqlen=32768, block=block, sparsity=sparsity, topk=topk, nblocks=n,
                flops={m: bench.case_flops(1, 12, 128, n, topk, block, m) for m in bench.MODES},
                dense_flops={m: bench.dense_flops(1, 12, 128, 32768, 32768, m) for m in bench.MODES})
            for mode in ("fwd", "bwd"):
                runner.record(case, "route", "triton", mode, "ok", ms=timings["triton"], metadata_ms=0.01,
                              served_by="triton")
                runner.record(case, "route", "cute", mode, "ok", ms=timings["cute"], metadata_ms=0.02,
                              served_by="fa4")
                runner.record(case, "peer", "sdpa-flash", mode, "ok", ms=timings["sdpa-flash"], dense=True)
                runner.record(case, "peer", "fa4-bsparse", mode, "ok", ms=timings["fa4-bsparse"])
                runner.record(case, "peer", "flex", mode, "skipped", reason="FlexAttention not available")
    bench.add_ratios(runner.results)
    return {"schema": 1, "name": "synthetic", "env": {"gpu": "FAKE H200", "git_commit": "0" * 40,
                                                      "torch": "x", "flash-attn-4": "4.0.0b36"},
            "config": vars(args), "results": runner.results}


def test_json_writer_and_ratios(bench, tmp_path):
    payload = _synthetic_payload(bench)
    path = bench.write_json(payload, tmp_path / "sub" / "r.json")
    back = json.loads(path.read_text())
    assert back["env"]["gpu"] == "FAKE H200" and len(back["results"]) == 2 * 2 * 2 * 5
    cute = [r for r in back["results"] if r["name"] == "cute"]
    assert all(r["vs"]["triton"] == pytest.approx(2.0) and r["vs"]["sdpa-flash"] == pytest.approx(8.0)
               for r in cute)
    assert all("flex" not in r["vs"] for r in cute)  # skipped peers are not ratioed
    r = cute[0]
    assert r["effective_tflops"] == pytest.approx(r["effective_flops"] / 1e-3 / 1e12)
    dense = [r for r in back["results"] if r["name"] == "sdpa-flash"][0]
    assert dense["flops"] > dense["effective_flops"] and dense["dense"] is True
    skipped = [r for r in back["results"] if r["status"] == "skipped"]
    assert skipped and all(r["reason"] and r["ms"] is None for r in skipped)
    bwd = [r for r in cute if r["mode"] == "bwd"][0]
    fwd = [r for r in cute if r["mode"] == "fwd" and r["block_size"] == bwd["block_size"]
           and r["sparsity"] == bwd["sparsity"]][0]
    assert bwd["effective_flops"] == pytest.approx(2.5 * fwd["effective_flops"])
    bench.print_table(back["results"])


def test_plot_and_replot(bench, tmp_path):
    pytest.importorskip("matplotlib")
    payload = _synthetic_payload(bench)
    png = bench.plot_results(payload, tmp_path / "p.png")
    assert png is not None and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    js = bench.write_json(payload, tmp_path / "r.json")
    assert bench.main(["--replot", str(js), "--plot", str(tmp_path / "q.png")]) == 0
    assert (tmp_path / "q.png").stat().st_size > 10_000


def test_plot_without_matplotlib_is_skipped(bench, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    assert bench.plot_results(_synthetic_payload(bench), tmp_path / "n.png") is None


def test_sm120_route_is_opt_in_with_variants(bench):
    a = bench.parse_args(["--routes", "sm120", "--sm120-variants", "w4r3", "simple_split"])
    assert a.routes == ["sm120"] and a.sm120_variants == ["w4r3", "simple_split"]
    assert bench.parse_args([]).sm120_variants is None  # the adapter's per-arch default


def test_env_context_sets_clears_and_restores(bench, monkeypatch):
    monkeypatch.setenv("FASTVIDEO_VSA_TRITON", "1")
    monkeypatch.delenv("FASTVIDEO_VSA_CUTEDSL", raising=False)
    monkeypatch.delenv("FASTVIDEO_VSA_BACKEND", raising=False)
    with bench._env({"FASTVIDEO_VSA_BACKEND": "sm120"}, clear=bench.ROUTE_ENV.values()):
        assert os.environ["FASTVIDEO_VSA_BACKEND"] == "sm120"
        assert "FASTVIDEO_VSA_TRITON" not in os.environ
    assert os.environ["FASTVIDEO_VSA_TRITON"] == "1" and "FASTVIDEO_VSA_BACKEND" not in os.environ
    with bench._route_env("cute"):
        assert os.environ["FASTVIDEO_VSA_CUTEDSL"] == "1" and "FASTVIDEO_VSA_TRITON" not in os.environ
    assert os.environ["FASTVIDEO_VSA_TRITON"] == "1" and "FASTVIDEO_VSA_CUTEDSL" not in os.environ
