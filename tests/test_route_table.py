"""The measured route table: its loader's checks, and routing by it (per direction)."""

import copy
import json

import pytest
import torch

import fastvideo_cute as fvc
from fastvideo_cute import ops, route_table, routes
from fastvideo_cute.backends import registry
from fastvideo_cute.backends.triton_backend import TritonBackend
from fastvideo_cute.call import CallInfo
from fastvideo_cute.route_table import RouteTableError, load_route_table, parse_route_table

from .conftest import HAS_CUDA

GOOD = {"schema": 1, "source": "benchmarks/results/vsa_h200_routes.json",
        "measured_with": {"gpu": "NVIDIA H200", "nvidia-cudnn-frontend": "1.32.0"},
        "entries": [{"arch": "sm_90", "block_size": 64, "direction": "fwd", "tiles": "full", "head_dim": 128,
                     "order": ["cudnn", "triton"]},
                    {"arch": "sm_90", "block_size": 64, "direction": "bwd", "tiles": "full", "head_dim": 128,
                     "order": ["triton"]}]}


def _installed_1_32(name):
    return {"nvidia-cudnn-frontend": "1.32.0"}.get(name)


def test_good_table_parses():
    t = parse_route_table(GOOD, installed=_installed_1_32)
    assert t.order(("sm_90", 64, "fwd", "full", 128)) == ("cudnn", "triton")
    assert t.order(("sm_90", 64, "fwd", "partial", 128)) is None


@pytest.mark.parametrize("mutate,words", [
    (lambda d: d.update(schema=2), "schema must be 1"),
    (lambda d: d.pop("source"), "'source' must name"),
    (lambda d: d.update(entries=[]), "'entries' must be a non-empty list"),
    (lambda d: d["entries"][0].update(direction="both"), "'direction' must be one of"),
    (lambda d: d["entries"][0].update(tiles="ragged"), "'tiles' must be one of"),
    (lambda d: d["entries"][0].update(block_size=96), "'block_size' must be 64, 128 or 256"),
    (lambda d: d["entries"][0].update(order=[]), "'order' must be a non-empty list"),
    (lambda d: d["entries"][0].update(order=["triton", "triton"]), "distinct backend names"),
    (lambda d: d["entries"][1].update(direction="fwd", order=["fa4"]), "duplicate call class"),
    (lambda d: d["entries"][0].update(arch="90"), "'arch' must look like"),
])
def test_malformed_tables_are_rejected(mutate, words):
    data = copy.deepcopy(GOOD)
    mutate(data)
    with pytest.raises(RouteTableError, match=words) as info:
        parse_route_table(data, installed=_installed_1_32)
    assert "--write-route-table" in str(info.value)


def test_stale_tables_are_rejected():
    with pytest.raises(RouteTableError, match=r"stale: measured with nvidia-cudnn-frontend==1.32.0, installed 1.33.0"):
        parse_route_table(GOOD, installed=lambda n: "1.33.0" if n == "nvidia-cudnn-frontend" else None)
    with pytest.raises(RouteTableError, match=r"does not have: \['cudnn'\] \(stale table\)"):
        parse_route_table(GOOD, known_backends=["triton", "fa4"], installed=_installed_1_32)


def test_unreadable_and_invalid_json(tmp_path):
    with pytest.raises(RouteTableError, match="cannot be read"):
        load_route_table(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RouteTableError, match="not valid JSON"):
        load_route_table(bad)


class _Probe(TritonBackend):
    name = "probe"

    def verified_on(self, arch):
        return True


@pytest.fixture
def probe_table(tmp_path, monkeypatch):
    """A table for this machine's call class that puts the probe first for the forward only."""
    registry.register(_Probe())
    dev = "cuda" if HAS_CUDA else "cpu"
    arch = torch.cuda.get_device_capability() if HAS_CUDA else None
    if arch is None:  # CPU: routing by the table needs an arch; pretend the call is on sm_90
        monkeypatch.setattr("fastvideo_cute.call.arch_of", lambda device: (9, 0))
        arch = (9, 0)
    table = {"schema": 1, "source": "test", "measured_with": {},
             "entries": [{"arch": f"sm_{arch[0]}{arch[1]}", "block_size": 64, "direction": "fwd", "tiles": "partial",
                          "head_dim": 32, "order": ["probe", "triton"]},
                         {"arch": f"sm_{arch[0]}{arch[1]}", "block_size": 64, "direction": "bwd", "tiles": "partial",
                          "head_dim": 32, "order": ["triton"]}]}
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(route_table.TABLE_ENV, str(path))
    for name in ("FASTVIDEO_VSA_TRITON", "FASTVIDEO_VSA_CUTEDSL", "FASTVIDEO_VSA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    yield dev
    registry.REGISTRY.pop("probe")


def test_default_route_follows_the_table_per_direction(probe_table):
    dev = probe_table
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 128, 32, generator=g).to(dev).requires_grad_(True) for _ in range(3))
    m = torch.ones(1, 2, 2, 2, dtype=torch.bool, device=dev)
    s = torch.tensor([64, 50], dtype=torch.int32, device=dev)
    before = ops.dispatch_counts.copy()
    out, lse = fvc.block_sparse_attn(q, k, v, m, s)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    ran = {key: n - before[key] for key, n in ops.dispatch_counts.items() if n != before[key]}
    assert ran == {("probe", "fwd"): 1, ("triton", "bwd"): 1}, ran
    # The same call on one backend for both directions: the contract is shared, so equal bit for bit.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTVIDEO_VSA_TRITON", "1")
        out2, lse2 = fvc.block_sparse_attn(q, k, v, m, s)
        grads2 = torch.autograd.grad(out2.sum(), (q, k, v))
    assert torch.equal(out, out2) and torch.equal(lse, lse2) and all(torch.equal(a, b) for a, b in zip(grads, grads2))


def test_a_stale_table_is_logged_once_and_ignored(tmp_path, monkeypatch, caplog):
    path = tmp_path / "t.json"
    entries = [dict(e, order=["triton"]) for e in GOOD["entries"]]
    path.write_text(json.dumps({**GOOD, "entries": entries, "measured_with": {"fastvideo-cute": "0.0.1"}}))
    monkeypatch.setenv(route_table.TABLE_ENV, str(path))
    monkeypatch.setattr(routes, "_LOGGED", set())
    info = CallInfo("block_sparse", "cuda", (9, 0), torch.bfloat16, 128, 64, False, q_len=4096, kv_len=4096,
                    kv_all_full=True)
    with caplog.at_level("WARNING", logger="fastvideo_cute"):
        assert routes.select_route(info).name == "triton"
        routes.select_route(info)
    assert sum("stale: measured with fastvideo-cute==0.0.1" in r.getMessage() for r in caplog.records) == 1


def test_table_off(monkeypatch):
    monkeypatch.setenv(route_table.TABLE_ENV, "off")
    assert route_table.active_route_table(["triton"]) is None


def test_the_shipped_table_is_valid_and_names_its_results():
    from pathlib import Path

    from fastvideo_cute.backends import BACKENDS

    if not route_table.DEFAULT_PATH.is_file():
        pytest.skip("no route table shipped")
    data = json.loads(route_table.DEFAULT_PATH.read_text())
    table = parse_route_table(data, str(route_table.DEFAULT_PATH), BACKENDS, installed=lambda name: None)
    repo = Path(__file__).resolve().parents[1]
    for source in table.source.split(" + "):
        assert (repo / source).is_file(), f"the table's results file {source} is not committed"


def test_writer_ranks_backends_per_class(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "route_table_writer", Path(__file__).resolve().parents[1] / "benchmarks" / "route_table_writer.py")
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)

    def row(name, mode, ms, seqlen=32768, status="ok", tiles="full"):
        return {"kind": "route", "name": name, "mode": mode, "block_size": 64, "tiles": tiles, "head_dim": 128,
                "status": status, "ms": ms, "seqlen": seqlen}

    payload = {"env": {"capability": [9, 0], "gpu": "H200", "git_commit": "abc", "triton": "3.6.0"},
               "results": [row("triton", "fwd", 2.0), row("cudnn", "fwd", 1.0), row("fa4", "fwd", 1.5),
                           row("triton", "fwd", 4.0, 65536), row("cudnn", "fwd", 3.5, 65536),
                           row("fa4", "fwd", 1.0, 65536, status="error"),
                           row("triton", "bwd", 2.0), row("cudnn", "bwd", 2.5), row("default", "bwd", 0.1)]}
    table = writer.build_route_table(payload, "benchmarks/results/x.json")
    orders = {(e["direction"], e["tiles"]): e["order"] for e in table["entries"]}
    assert orders == {("fwd", "full"): ["cudnn", "triton"], ("bwd", "full"): ["triton", "cudnn"]}
    parsed = parse_route_table(table, installed=lambda name: None)
    assert parsed.order(("sm_90", 64, "fwd", "full", 128)) == ("cudnn", "triton")


def test_writer_takes_a_class_from_the_first_run_that_measured_it():
    """Several runs (a newer run of some classes listed first): a class measured by two runs comes
    whole from the first one, the others from wherever they were measured."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "route_table_writer", Path(__file__).resolve().parents[1] / "benchmarks" / "route_table_writer.py")
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)

    def row(name, mode, ms, seqlen=32768):
        return {"kind": "route", "name": name, "mode": mode, "block_size": 64, "tiles": "full", "head_dim": 128,
                "status": "ok", "ms": ms, "seqlen": seqlen}

    env = {"capability": [9, 0], "gpu": "H200", "git_commit": "abc"}
    newer = {"env": env, "results": [row("sm90", "bwd", 4.6), row("cudnn", "bwd", 4.9)]}
    older = {"env": env, "results": [row("sm90", "bwd", 5.0), row("cudnn", "bwd", 4.8), row("sm90", "bwd", 20.0, 65536),
                                     row("cudnn", "bwd", 18.0, 65536), row("triton", "fwd", 2.0),
                                     row("sm90", "fwd", 1.5)]}
    table = writer.build_route_table([newer, older], "a.json + b.json")
    by = {(e["direction"]): e for e in table["entries"]}
    assert by["bwd"]["order"] == ["sm90", "cudnn"] and by["bwd"]["cases"] == 1
    assert by["bwd"]["ms"] == {"sm90": 4.6, "cudnn": 4.9}
    assert by["fwd"]["order"] == ["sm90", "triton"]
