"""benchmarks/bench_vsa.py on CPU: argument parsing, FLOP accounting, JSON and chart writers
(synthetic timings; nothing is benchmarked here). CI installs .[bench], so the chart tests run
there; without matplotlib they skip, and --replot must fail with the install hint."""

import os
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_vsa.py"


@pytest.fixture(scope="module")
def bench(load_script):
    return load_script("bench_vsa")


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
    assert set(a.peers) == {"sdpa-flash", "sdpa-cudnn", "flex", "fa4-dense", "fa4-bsparse", "cudnn-bsa", "fastvideo",
                            "fastvideo-triton"}
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
                seqlen=32768, block=block, sparsity=sparsity, topk=topk, nblocks=n, grid=None, tile=None,
                all_full=True,
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
    with bench._env({"FASTVIDEO_VSA_BACKEND": "sm120"}, clear=bench.ROUTE_VARS):
        assert os.environ["FASTVIDEO_VSA_BACKEND"] == "sm120"
        assert "FASTVIDEO_VSA_TRITON" not in os.environ
    assert os.environ["FASTVIDEO_VSA_TRITON"] == "1" and "FASTVIDEO_VSA_BACKEND" not in os.environ
    with bench._route_env("cute"):
        assert os.environ["FASTVIDEO_VSA_CUTEDSL"] == "1" and "FASTVIDEO_VSA_TRITON" not in os.environ
    assert os.environ["FASTVIDEO_VSA_TRITON"] == "1" and "FASTVIDEO_VSA_CUTEDSL" not in os.environ


def test_list_routes_select_their_base_route_and_carry_the_top_k_lists(bench, monkeypatch):
    import torch

    a = bench.parse_args(["--routes", "default-lists", "cute-lists", "default", "--block-size", "64"])
    assert a.routes == ["default-lists", "cute-lists", "default"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--routes", "sm120-lists"])
    for var in bench.ROUTE_VARS:
        monkeypatch.delenv(var, raising=False)
    with bench._route_env("cute-lists"):
        assert os.environ["FASTVIDEO_VSA_CUTEDSL"] == "1"
    with bench._route_env("default-lists"):
        assert not any(v in os.environ for v in bench.ROUTE_VARS)
    # The lists are the map's selection, topk wide, every row full: what VSA's top-k hands over.
    small = bench.parse_args(["--seqlens", "1024", "--block-size", "64", "--heads", "2", "--sparsity", "0.75"])
    case = bench.Case(small, 1024, 64, 0.75, "cpu")
    assert case.q2k_idx.shape == (1, 2, 16, case.topk) == (1, 2, 16, 4) and case.q2k_idx.dtype == torch.int32
    assert bool((case.q2k_num == case.topk).all())
    rebuilt = torch.zeros_like(case.block_map).scatter_(-1, case.q2k_idx.long(), True)
    assert torch.equal(rebuilt, case.block_map)
    # The entry points the list routes call are the public *_from_indices functions.
    import fastvideo_cute as fc

    runner = object.__new__(bench.Runner)
    runner.args = small
    assert runner._api(64, lists=True) is fc.block_sparse_attn_from_indices
    assert runner._api(128, lists=False) is fc.block_sparse_attn_128


def _no_matplotlib(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)


def test_replot_without_matplotlib_fails_with_the_install_hint(bench, tmp_path, monkeypatch):
    js = bench.write_json(_synthetic_payload(bench), tmp_path / "r.json")
    _no_matplotlib(monkeypatch)
    with pytest.raises(SystemExit) as e:
        bench.main(["--replot", str(js), "--plot", str(tmp_path / "q.png")])
    assert isinstance(e.value.code, str) and "install .[bench]" in e.value.code  # str code: exit status 1
    assert not (tmp_path / "q.png").exists()


def test_replot_cli_without_matplotlib_exits_nonzero(tmp_path):
    js = tmp_path / "r.json"
    js.write_text(json.dumps({"results": []}))
    # sys.modules[name] = None makes "import matplotlib" raise ImportError, as if not installed.
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['bench_vsa.py', '--replot', {str(js)!r}, '--plot', {str(tmp_path / 'q.png')!r}]; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "install .[bench]" in r.stderr and "pip install 'fastvideo-cute[bench]'" in r.stderr
    assert "Traceback" not in r.stderr


def test_replot_unreadable_or_empty_results_fail(bench, tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(SystemExit, match="cannot read results"):
        bench.main(["--replot", str(tmp_path / "missing.json"), "--plot", str(tmp_path / "q.png")])
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"results": []}))
    with pytest.raises(SystemExit, match="no successful entries"):
        bench.main(["--replot", str(empty), "--plot", str(tmp_path / "q.png")])


def test_entry_colours_are_a_fixed_distinct_mapping(bench):
    from fastvideo_cute.adapters.cute_sm120 import VARIANTS

    names = list(bench.ROUTES) + list(bench.PEERS) + [f"sm120[{v}]" for v in VARIANTS if v != "simple"]
    for name in names:
        assert bench.entry_colour(name) == bench.ENTRY_COLOURS[name], name  # every entry has its own row
    colours = [bench.entry_colour(n) for n in names]
    assert len(set(c.lower() for c in colours)) == len(colours), "two entries share a colour"
    # An entry the table lacks gets a colour that depends on its name only.
    assert bench.entry_colour("sm120[new_variant]") == bench.entry_colour("sm120[new_variant]")
    assert bench.entry_colour("sm120[new_variant]") in bench._SPARE_COLOURS


def _uneven_payload(bench):
    """The synthetic payload with the triton route failed at 256-token blocks, so the 256 panels
    have one entry fewer and a per-panel colour cycle would shift every later entry's colour."""
    payload = _synthetic_payload(bench)
    for r in payload["results"]:
        if r["name"] == "triton" and r["block_size"] == 256:
            r.update(status="error", reason="synthetic failure", ms=None, effective_tflops=None, tflops=None)
    return payload


def _rgb(colour):
    from matplotlib.colors import to_rgb

    return tuple(round(255 * c) for c in to_rgb(colour))


def test_chart_gives_each_entry_one_colour_in_every_panel(bench, tmp_path):
    pytest.importorskip("matplotlib")
    plt = bench._import_pyplot()
    payload = _uneven_payload(bench)
    fig = bench.build_figure(payload, plt)
    seen = {}  # entry -> set of bar colours over all panels
    panels_with = {}
    for ax in fig.axes:
        for bars in ax.containers:
            name = bars.get_label().split("->")[0]
            panels_with[name] = panels_with.get(name, 0) + 1
            seen.setdefault(name, set()).update(_rgb(b.get_facecolor()[:3]) for b in bars.patches)
        for line in ax.get_lines():  # the dense peer's own-TF/s line: the peer's colour
            assert _rgb(line.get_color()) == _rgb(bench.entry_colour("sdpa-flash"))
    plt.close(fig)
    assert panels_with["cute"] == 4 and panels_with["triton"] == 2  # 2 modes x 2 block sizes; triton only at 128
    assert set(seen) == {"triton", "cute", "sdpa-flash", "fa4-bsparse"}
    for name, colours in seen.items():
        assert colours == {_rgb(bench.entry_colour(name))}, (name, colours)

    # The same through the CLI: a PNG redrawn from the results JSON holds every entry's colour.
    js = bench.write_json(payload, tmp_path / "r.json")
    png = tmp_path / "chart.png"
    assert bench.main(["--replot", str(js), "--plot", str(png)]) == 0
    import matplotlib.image

    pixels = (matplotlib.image.imread(str(png))[..., :3] * 255).round().astype(int).reshape(-1, 3)
    present = set(map(tuple, pixels.tolist()))
    for name in seen:
        assert _rgb(bench.entry_colour(name)) in present, name


def test_summary_compares_the_best_route_with_the_best_sparse_peer(bench):
    payload = _synthetic_payload(bench)
    rows = bench.summarize(payload["results"])
    assert rows and all(r["best_route"] == "cute" and r["best_peer"] == "fa4-bsparse" for r in rows)
    assert all(r["speedup"] == pytest.approx(0.9) for r in rows)  # 0.9 ms peer / 1.0 ms route
    bench.print_summary(rows)


def test_grid_arguments(bench):
    a = bench.parse_args(["--grid", "21", "30", "52", "--tile", "4", "4", "4", "--tile", "2", "8", "8"])
    assert a.grid == [21, 30, 52] and a.tile == [[4, 4, 4], [2, 8, 8]]
    with pytest.raises(SystemExit):
        bench.parse_args(["--grid", "21", "30", "52"])


def test_rounds_merge_to_the_median_of_interleaved_measurements(bench):
    """``--rounds N``: every entry of a case measured N times; one record each, ms the median
    (its TF/s recomputed), the rounds kept; an entry that failed in a round keeps the failure."""
    args = bench.parse_args(["--seqlens", "32768", "--block-size", "128", "--rounds", "3"])
    assert args.rounds == 3 and bench.parse_args([]).rounds == 1
    runner = bench.Runner(args)
    n, topk = 256, bench.topk_for(0.875, 256)
    case = types.SimpleNamespace(
        seqlen=32768, block=128, sparsity=0.875, topk=topk, nblocks=n, grid=None, tile=None, all_full=True,
        flops={m: bench.case_flops(1, 12, 128, n, topk, 128, m) for m in bench.MODES},
        dense_flops={m: bench.dense_flops(1, 12, 128, 32768, 32768, m) for m in bench.MODES})
    for ms_route, ms_peer, peer_status in ((1.0, 0.8, "ok"), (3.0, 0.9, "error"), (2.0, 1.1, "ok")):
        runner.record(case, "route", "cute", "fwd", "ok", ms=ms_route, served_by="fa4")
        runner.record(case, "peer", "fa4-bsparse", "fwd", peer_status, ms=ms_peer if peer_status == "ok" else None,
                      reason=None if peer_status == "ok" else "boom")
    merged = bench.merge_rounds(runner.results)
    assert [(r["kind"], r["name"]) for r in merged] == [("route", "cute"), ("peer", "fa4-bsparse")]
    route, peer = merged
    assert route["ms"] == 2.0 and route["ms_rounds"] == [1.0, 3.0, 2.0]
    assert route["effective_tflops"] == pytest.approx(bench.tflops(route["effective_flops"], 2.0))
    assert peer["status"] == "error" and peer["reason"] == "boom"
    even = bench.merge_rounds([dict(route, ms=1.0), dict(route, ms=2.0)])
    assert len(even) == 1 and even[0]["ms"] == 1.5


def test_rounds_rotate_the_entry_order(bench):
    """Round r starts r entries later, so over len(entries) rounds every entry runs in every
    position once; round 0 is routes then peers as given."""
    routes, peers = ["default", "cute"], ["cudnn-bsa", "fastvideo", "fa4-bsparse"]
    entries = [("route", r) for r in routes] + [("peer", p) for p in peers]
    orders = [bench.round_order(routes, peers, r) for r in range(len(entries))]
    assert orders[0] == entries
    for order in orders:
        assert sorted(order) == sorted(entries)
    for pos in range(len(entries)):
        assert sorted(o[pos] for o in orders) == sorted(entries)
    assert bench.round_order(routes, peers, len(entries)) == entries
    assert bench.round_order([], [], 3) == []


def test_rounds_keep_each_rounds_predecessor_and_entries_settle_by_default(bench, monkeypatch):
    """``after_rounds``: the entry that ran just before, per round (the H100 tables showed the entry
    after FastVideo's slower); ``--settle`` defaults to 0.5 s between entries and 0 skips the device
    calls altogether (this test has no GPU: a call would raise)."""
    assert bench.parse_args([]).settle == 0.5 and bench.parse_args(["--settle", "0"]).settle == 0.0
    row = dict(kind="route", name="default", mode="bwd", seqlen=32768, block_size=64, sparsity=0.875, status="ok",
               flops=1e12, effective_flops=1e12)
    merged = bench.merge_rounds([dict(row, ms=1.0, after=None), dict(row, ms=1.3, after="fastvideo"),
                                 dict(row, ms=1.1, after="cudnn-bsa")])
    assert len(merged) == 1 and merged[0]["after_rounds"] == [None, "fastvideo", "cudnn-bsa"]
    assert "after" not in merged[0] and merged[0]["ms"] == 1.1
    slept = []
    monkeypatch.setattr(bench.time, "sleep", slept.append)
    bench.settle(0)
    assert slept == []
